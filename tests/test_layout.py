"""The house rules, checked so they stay true: every module of proxy/ has a test file (or a line in
tests/README.md naming the file that covers it), no test file imports another's helpers, and no module
of proxy/ is over 400 lines nor any function over 50 unless a comment gives the measurement that keeps
it whole (``# kept whole: ...`` on the line before the ``def``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "proxy"
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 50
KEPT_WHOLE = "# kept whole:"  # then the measurement, e.g. "a frame per chunk cost 4 % (callgrind)"


def _mirror(module: Path) -> Path:
    rel = module.relative_to(PACKAGE)
    return ROOT / "tests" / rel.parent / f"test_{rel.stem}.py"


def _covered() -> dict[str, list[str]]:
    lines = (ROOT / "tests" / "README.md").read_text().splitlines()
    found = (re.match(r"- (proxy/\S+\.py): (.*)", line) for line in lines)
    return {m.group(1): re.findall(r"tests/\S+\.py", m.group(2)) for m in found if m}


@pytest.mark.parametrize("module", [pytest.param(m, id=str(m.relative_to(ROOT))) for m in MODULES])
def test_every_module_has_a_test_file_or_a_line_naming_the_one_that_covers_it(module: Path) -> None:
    rel = str(module.relative_to(ROOT))
    named = _covered().get(rel)
    if _mirror(module).exists():
        assert named is None, f"{rel} has {_mirror(module).relative_to(ROOT)}: drop its line in tests/README.md"
        return
    assert named, f"{rel}: no {_mirror(module).relative_to(ROOT)} and no line in tests/README.md"
    assert all((ROOT / name).exists() for name in named), named


def test_tests_readme_names_only_modules_that_exist() -> None:
    assert [m for m in _covered() if not (ROOT / m).exists()] == []


def test_no_test_file_imports_another_test_files_helpers() -> None:
    found = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[-1].startswith("test_"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}")
    assert found == []


@pytest.mark.parametrize("module", [pytest.param(m, id=str(m.relative_to(ROOT))) for m in MODULES])
def test_no_module_is_over_400_lines(module: Path) -> None:
    assert len(module.read_text().splitlines()) <= MAX_MODULE_LINES


def _kept_whole(lines: list[str], above: int) -> bool:
    """Does the comment block just above a ``def`` (line index ``above`` upwards) say why it is kept whole?"""
    while above >= 0 and lines[above].strip().startswith("#"):
        if lines[above].strip().startswith(KEPT_WHOLE):
            return True
        above -= 1
    return False


def long_functions(source: str) -> list[str]:
    """Functions over ``MAX_FUNCTION_LINES`` (decorators and docstring included) without a
    ``# kept whole:`` comment on the line before their ``def``."""
    lines = source.splitlines()
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = (node.end_lineno or node.lineno) - start + 1
            if length > MAX_FUNCTION_LINES and not _kept_whole(lines, start - 2):
                out.append(f"{node.name} ({length} lines, line {node.lineno})")
    return out


@pytest.mark.parametrize("module", [pytest.param(m, id=str(m.relative_to(ROOT))) for m in MODULES])
def test_no_function_is_over_50_lines_unless_a_measurement_keeps_it_whole(module: Path) -> None:
    assert long_functions(module.read_text()) == []


@pytest.mark.parametrize(
    ("source", "found"),
    [
        pytest.param("def f():\n" + "    x = 1\n" * 50, ["f (51 lines, line 1)"], id="51-lines"),
        pytest.param("def f():\n" + "    x = 1\n" * 49, [], id="50-lines"),
        pytest.param("# kept whole: one frame per chunk cost 4 % (callgrind)\ndef f():\n" + "    x = 1\n" * 60, [],
                     id="kept-whole-by-a-measurement"),
        pytest.param("class C:\n    async def g(self):\n" + "        x = 1\n" * 60, ["g (61 lines, line 2)"],
                     id="a-method"),
        pytest.param("# kept whole: measured\n# (more words)\ndef f():\n" + "    x = 1\n" * 60, [],
                     id="kept-whole-over-two-comment-lines"),
        pytest.param("# long, but nobody measured\ndef f():\n" + "    x = 1\n" * 60, ["f (61 lines, line 2)"],
                     id="a-comment-without-a-measurement"),
    ],
)
def test_the_function_length_check_finds_what_it_should(source: str, found: list[str]) -> None:
    assert long_functions(source) == found
