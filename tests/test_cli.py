"""The ``firstbyte`` command as a newcomer meets it: --version, help with defaults, and one clear
line (no traceback) for a busy port, a missing ledger, a bad --since, a YAML syntax error or a control
character in the file."""

from __future__ import annotations

import asyncio
import configparser
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def firstbyte(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy.cli", *args], capture_output=True, text=True,
                          timeout=30, check=False, cwd=cwd)


def one_line_error(run: subprocess.CompletedProcess[str]) -> str:
    assert run.returncode == 1, run
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    return lines[0]


def test_version_is_the_package_version() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    run = firstbyte("--version")
    assert run.returncode == 0 and run.stdout.strip() == f"firstbyte {cfg['metadata']['version']}"


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        pytest.param("serve", ["run the gateway", "(default: routes.yaml)", "--listen"], id="serve"),
        pytest.param("check", ["validate a routes file", "(default: routes.yaml)"], id="check"),
        pytest.param("explain", ["the order a request", "else http://127.0.0.1:8080)", "--config"], id="explain"),
        pytest.param("simulate", ["simulated provider", "(default: 9000)", "(default: 120.0)"], id="simulate"),
        pytest.param("decisions", ["summarise the decision ledger", "(default: firstbyte.db)"], id="decisions"),
    ],
)
def test_subcommand_help_has_a_description_and_defaults(command: str, shown: list[str]) -> None:
    run = firstbyte(command, "--help")
    assert run.returncode == 0
    text = " ".join(run.stdout.split())
    for piece in shown:
        assert piece in text, (piece, run.stdout)


def test_a_busy_port_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        config = tmp_path / "routes.yaml"
        config.write_text("providers: {sim: {kind: simulated}}\n"
                          "routes: {chat: {targets: [{provider: sim, model: s}]}}\n")
        run = firstbyte("--log-level", "error", "serve", "--config", str(config), "--listen", f"127.0.0.1:{port}")
    line = one_line_error(run)
    assert line == (f"firstbyte serve: cannot listen on 127.0.0.1:{port}: the address is already in use "
                    "(another firstbyte? pick another with --listen or the file's listen)")


def test_a_busy_port_for_simulate_is_one_line() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        run = firstbyte("--log-level", "error", "simulate", "--port", str(port))
    assert one_line_error(run).endswith("already in use (another firstbyte? pick another with --port)")


def test_a_missing_ledger_is_one_line(tmp_path: Path) -> None:
    line = one_line_error(firstbyte("decisions", "--ledger", str(tmp_path / "none.db")))
    assert line.startswith(f"firstbyte decisions: no ledger at {tmp_path / 'none.db'}")
    assert not (tmp_path / "none.db").exists()  # asking does not create one


@pytest.mark.parametrize("since", ["1x", "abc", "-5m"])
def test_a_bad_since_is_one_line(tmp_path: Path, since: str) -> None:
    line = one_line_error(firstbyte("decisions", "--ledger", str(tmp_path / "l.db"), f"--since={since}"))
    assert line.startswith(f"firstbyte decisions: --since {since!r}")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        pytest.param("# a comment with a \x01 in it\nroutes: {}\n", "1:20", id="in-a-comment"),
        pytest.param("routes:\n  chat: {targets: []}  \x07\n", "2:24", id="after-a-value"),
        pytest.param("providers:\n  s: {kind: simulated, base_url: \"a\x1bb\"}\n", "2:36", id="in-a-string"),
    ],
)
def test_a_control_character_is_one_line_with_its_line_and_column(tmp_path: Path, text: str, where: str) -> None:
    """PyYAML refuses these before parsing (a ReaderError, raised where nothing caught it: issue 31)."""
    config = tmp_path / "routes.yaml"
    config.write_text(text)
    run = firstbyte("check", "--config", str(config))
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert f"{config}:{where}: not valid YAML: control character U+00" in run.stderr, run.stderr


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path: Path) -> None:
    config = tmp_path / "routes.yaml"
    config.write_text("routes:\n  chat: {targets: [\n")
    run = firstbyte("check", "--config", str(config))
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert f"{config}:3:1: not valid YAML: expected the node content" in run.stderr
    assert "<unicode string>" not in run.stderr


async def test_explain_config_needs_only_the_listen_not_the_gateways_secrets(upstreams, proxy, capsys, tmp_path,
                                                                            monkeypatch):
    """`firstbyte explain chat --config routes.yaml --key K` loads the whole config to read one
    field: a gateway with client keys (clients.keys_env) refuses to explain from any shell that
    does not hold every client key in its environment (the service's EnvironmentFile does, the
    operator's shell does not), although the key was given with --key."""
    from proxy.cli import main

    from .conftest import ok_handler, openai_provider

    up = await upstreams({"/v1/chat/completions": ok_handler("x")})
    p = await proxy({"clients": {"keys_env": "FB_REVIEW3_KEYS"}, "providers": {"a": openai_provider(up.url)},
                     "routes": {"chat": {"targets": [{"provider": "a", "model": "m"}]}}},
                    env={"FB_REVIEW3_KEYS": "good"})
    monkeypatch.delenv("FB_REVIEW3_KEYS", raising=False)
    config = tmp_path / "routes.yaml"
    config.write_text(f"listen: 127.0.0.1:{p.port}\nclients: {{keys_env: FB_REVIEW3_KEYS}}\n"
                      "providers: {a: {kind: simulated}}\nroutes: {chat: {targets: [{provider: a, model: m}]}}\n")
    code = await asyncio.to_thread(main, ["explain", "chat", "--config", str(config), "--key", "good"])
    err = capsys.readouterr().err
    assert code == 0, err


def test_check_into_a_closed_pipe_stops_quietly() -> None:
    """``firstbyte check ... | head``: the reader leaves before the plan is written. The command
    ends with SIGPIPE's exit status and no traceback (it used to print a BrokenPipeError's)."""
    proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", "check", "--config", str(ROOT / "routes.yaml")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first write
    with proc.stderr:
        stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=30) == 141
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_check_shows_whether_each_route_races(tmp_path: Path) -> None:
    config = tmp_path / "routes.yaml"
    config.write_text("providers: {s: {kind: simulated}}\nroutes:\n"
                      "  quick: {strategy: fastest, targets: [{provider: s, model: m}]}\n"
                      "  calm: {strategy: fastest, hedge: false, targets: [{provider: s, model: m}]}\n"
                      "  bare:\n    strategy: ordered\n    hedge:\n    targets: [{provider: s, model: m}]\n"
                      "  plain: {targets: [{provider: s, model: m}]}\n")
    run = firstbyte("check", "--config", str(config))
    assert run.returncode == 0, run.stderr
    heads = [line for line in run.stdout.splitlines() if line.startswith("route ")]
    assert heads == [
        "route quick  strategy=fastest  races: after p90, max_extra 0.1, explore on, refresh 0.3s, cap 4",
        "route calm  strategy=fastest  races: no (hedge: false)",
        "route bare  strategy=ordered  races: after p90, max_extra 0.1, explore on, refresh 0.3s, cap 4",
        "route plain  strategy=ordered  races: no (no hedge: set)",
    ]


@pytest.mark.parametrize(
    ("workers", "limit", "warned"),
    [
        pytest.param(2, 1, True, id="two-workers-one-place-warns"),
        pytest.param(3, 2, True, id="three-workers-two-places-warns"),
        pytest.param(2, 2, False, id="a-place-each-is-quiet"),
        pytest.param(2, 3, True, id="one-and-two-places-warns"),
        pytest.param(3, 4, True, id="one-one-and-two-places-warns"),
        pytest.param(2, 4, False, id="two-places-each-is-quiet"),
        pytest.param(3, 7, False, id="two-and-three-places-is-quiet"),
        pytest.param(1, 1, False, id="one-worker-is-quiet"),
    ],
)
def test_check_warns_when_workers_outnumber_a_providers_max_concurrent(tmp_path: Path, workers: int, limit: int,
                                                                       warned: bool) -> None:
    """A worker ranked past the limit holds no place of it: its calls fail over at once (503 busy)
    while the upstream idles. ``check`` says so, with what to set instead; the file stays valid."""
    config = tmp_path / "routes.yaml"
    config.write_text(f"workers: {workers}\nstate: {{redis: 'redis://127.0.0.1:6379/0', fleet: f}}\n"
                      f"providers: {{up: {{kind: simulated, max_concurrent: {limit}, queue: 8}},\n"
                      "            other: {kind: simulated}}\n"
                      "routes: {chat: {targets: [{provider: up, model: m}]},\n"
                      "         spare: {targets: [{provider: other, model: m}]}}\n")
    run = firstbyte("check", "--config", str(config))
    assert run.returncode == 0, run.stderr
    warnings = [line for line in run.stdout.splitlines() if line.startswith("warning:")]
    if not warned:
        assert warnings == []
        return
    if limit > workers:  # one or two places each: the uneven split is said
        assert warnings == [
            f"warning: providers.up.max_concurrent: {limit} is split among {workers} workers (routes: chat); "
            f"{2 * workers - limit} of them {'holds' if 2 * workers - limit == 1 else 'hold'} 1 place and the "
            f"others 2, so a second call to up on a one-place member waits or fails over (503 busy when the route "
            f"has no other target) while another may have room; split it evenly: max_concurrent {workers} or "
            f"{2 * workers} (docs/adr/0016)"]
        return
    assert warnings == [
        f"warning: providers.up.max_concurrent: {limit} is split among {workers} workers (routes: chat); "
        f"{workers - limit} of them gets no place, so their calls to up fail over at once (503 busy when the "
        f"route has no other target) while the upstream may idle; set max_concurrent to at least {workers} "
        f"(the fleet's whole limit, split: docs/adr/0016), or workers to at most {limit}"]


@pytest.mark.parametrize("listen", [
    pytest.param("nonsense", id="no-port"),
    pytest.param("127.0.0.1:", id="empty-port"),
    pytest.param("[::1]:abc", id="word-port"),
    pytest.param("127.0.0.1:99999", id="past-65535"),
])
def test_a_bad_listen_is_one_line_naming_it(tmp_path: Path, listen: str) -> None:
    """A reviewer's ``--listen``: a word was a traceback (``int()`` of it), and a port past 65535 was taken
    modulo 65536 (99999 listened on 34463 while the log said 99999); the file's ``listen`` let 99999 by too.
    Both are refused with the value, as the file's other problems are."""
    config = tmp_path / "routes.yaml"
    config.write_text("providers: {sim: {kind: simulated}}\nroutes: {chat: {targets: [{provider: sim, model: s}]}}\n")
    run = firstbyte("--log-level", "error", "serve", "--config", str(config), "--listen", listen)
    assert one_line_error(run) == f"firstbyte serve: --listen: expected HOST:PORT (a port up to 65535), got {listen!r}"
    config.write_text(f"listen: {listen!r}\n" + config.read_text())
    checked = firstbyte("check", "--config", str(config))
    assert checked.returncode == 1
    assert f"listen: expected HOST:PORT (a port up to 65535), got {listen!r}" in checked.stderr, checked.stderr
