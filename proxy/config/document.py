"""The YAML document of a routes file, refused before it is read when it is not one to read.

Duplicate keys (named by path), nesting past ``MAX_YAML_DEPTH`` and aliases that expand past
``MAX_YAML_NODES`` nodes are problems here, before the reader sees any value.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from ..bounds import MAX_YAML_DEPTH, MAX_YAML_NODES
from ..errors import ConfigError
from .fields import key_of

__all__ = ["read_yaml", "yaml_problem"]


def yaml_problem(source: str, exc: yaml.YAMLError, text: str = "") -> str:
    """A YAML syntax error as ``FILE:LINE:COLUMN: what`` (PyYAML's own text names
    ``<unicode string>`` instead of the file, and spreads over several lines)."""
    if isinstance(exc, yaml.reader.ReaderError):  # a control character: PyYAML says only its offset
        before = text[:exc.position]
        line, column = before.count("\n") + 1, exc.position - before.rfind("\n")
        code = exc.character if isinstance(exc.character, int) else ord(str(exc.character)[:1] or "\0")
        return (f"{source}:{line}:{column}: not valid YAML: control character U+{code:04X} is not allowed "
                "anywhere in the file, comments included; delete it")
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
    return f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")



_FLOW_NESTING = re.compile(r"(?:[\[{]\s*|-[ \t]+){" + str(MAX_YAML_DEPTH + 1) + "}")  # [[[[, {{{{ or - - - -


def read_yaml(text: str, source: str = "<memory>") -> Any:
    """The YAML document in ``text``, refused (ConfigError) when it is not one firstbyte should read:
    duplicate keys (named by path), nesting past ``MAX_YAML_DEPTH``, aliases that expand past
    ``MAX_YAML_NODES`` nodes (an alias bomb is refused before anything expands it)."""
    if _FLOW_NESTING.search(text):  # PyYAML's scanner slows quadratically per flow level: refuse first
        raise ConfigError(source, [f"(file): nested too deeply (at most {MAX_YAML_DEPTH} levels)"])
    try:
        loader = yaml.SafeLoader(text)  # reads every character first: a control character is refused here
    except yaml.YAMLError as exc:
        raise ConfigError(source, [yaml_problem(source, exc, text)]) from None
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise ConfigError(source, [f"(file): nested too deeply (at most {MAX_YAML_DEPTH} levels)"]) from None
        except yaml.YAMLError as exc:
            raise ConfigError(source, [yaml_problem(source, exc)]) from None
        if node is None:
            return None
        problems = _node_problems(node)
        if problems:
            raise ConfigError(source, problems)
        try:
            return loader.construct_document(node)
        except yaml.YAMLError as exc:
            raise ConfigError(source, [yaml_problem(source, exc)]) from None
    finally:
        loader.dispose()


def _node_problems(root: yaml.Node) -> list[str]:
    """Duplicate keys, depth and expanded size of a composed document, each node visited once
    (an alias is the same node object again, so nothing here expands the alias graph)."""
    return _duplicate_keys(root) or _size_problems(root)


def _duplicate_keys(root: yaml.Node) -> list[str]:
    """Pre-order, first path wins."""
    problems: list[str] = []
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, str]] = [(root, "(top)")]
    while stack:  # pre-order, first path wins: duplicate keys
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else None
                where = key_of(name) if path == "(top)" else f"{path}.{key_of(name)}"
                if name is not None and name in first:
                    problems.append(f"{where}: duplicate key (lines {first[name]} and {key.start_mark.line + 1})")
                elif name is not None:
                    first[name] = key.start_mark.line + 1
                stack.append((value, where))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(node.value))
    return problems


def _size_problems(root: yaml.Node) -> list[str]:
    """Post-order, memoised by node: depth and the node count once aliases are expanded."""
    problems: list[str] = []
    sizes: dict[int, tuple[int, int]] = {}
    order: list[yaml.Node] = []
    pending: list[yaml.Node] = [root]
    visited: set[int] = set()
    while pending:
        node = pending.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        order.append(node)
        pending.extend(_children(node))
    for node in reversed(order):  # children before parents (a composed document has no cycles)
        size, depth = 1, 1
        for child in _children(node):
            child_size, child_depth = sizes.get(id(child), (1, 1))
            size = min(size + child_size, MAX_YAML_NODES + 1)
            depth = max(depth, child_depth + 1)
        sizes[id(node)] = (size, depth)
    size, depth = sizes[id(root)]
    if depth > MAX_YAML_DEPTH:
        problems.append(f"(file): nested {depth} levels deep; at most {MAX_YAML_DEPTH} are read")
    if size > MAX_YAML_NODES:
        problems.append(f"(file): aliases expand to more than {MAX_YAML_NODES} nodes (an alias bomb?); "
                        "write the values out or share fewer")
    return problems


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []
