"""The package's public names are a contract: adding or removing one is a deliberate change."""

from __future__ import annotations

import proxy


def test_public_names_are_pinned() -> None:
    assert sorted(proxy.__all__) == [
        "Attempt",
        "ClientError",
        "Config",
        "ConfigError",
        "Decision",
        "Excluded",
        "FirstbyteError",
        "HeaderError",
        "ParsedDecision",
        "Ranked",
        "format_header",
        "load_config",
        "parse_config",
        "parse_header",
    ]
    for name in proxy.__all__:
        exported = vars(proxy).get(name)  # getattr would raise before an assert could say so
        assert callable(exported), f"proxy.{name} is {exported!r}, not a class or function"
        assert exported.__module__.startswith("proxy."), (name, exported.__module__)
