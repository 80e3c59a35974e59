"""Provider keys: from an environment variable (``api_key_env``) or a file (``api_key_file``).

Both are read when the routes file is loaded, so a reload (SIGHUP) picks up a rotated key
from either without a restart. A file suits systemd's credentials: ``LoadCredential=openai:/etc/
firstbyte/openai.key`` in the unit puts the key at ``$CREDENTIALS_DIRECTORY/openai``, readable by
the service alone, and ``api_key_file: ${CREDENTIALS_DIRECTORY}/openai`` names it. The value is
never written to a problem, a log line or the header of anything but the upstream call.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .fields import Reader, show

__all__ = ["HEADER_SAFE", "provider_key"]

HEADER_SAFE = re.compile(r"[\x20-\x7e]+")
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
MAX_KEY_FILE = 64 * 1024  # a key is a line; a bigger file is the wrong file


def provider_key(r: Reader, data: dict[str, Any], path: str, env: Mapping[str, str],
                 base: Path) -> tuple[str | None, str | None, str | None]:
    """(api_key_env, api_key_file, the key) of a provider. An unset variable or an empty file
    is no key (its targets are excluded, "no credentials"); a file that cannot be read, or a
    key a header cannot carry, is a problem."""
    key_env = r.string(data, "api_key_env", path, None)
    key_file = r.string(data, "api_key_file", path, None)
    if key_env and key_file:
        r.problem(f"{path}.api_key_file", "set api_key_env or api_key_file, not both")
        return key_env, key_file, None
    if key_env:
        key, where, what = env.get(key_env), f"{path}.api_key_env", f"environment variable {key_env}"
    elif key_file:
        key, where, what = _read(r, key_file, f"{path}.api_key_file", env, base), f"{path}.api_key_file", \
            f"file {show(key_file)}"
    else:
        return None, None, None
    if key and not HEADER_SAFE.fullmatch(key):
        # Never the value: only that it would split the upstream request's headers.
        r.problem(where, f"{what} holds a character other than printable ASCII (a CR/LF would split "
                  "the upstream request's headers); remove it")
        return key_env, key_file, None
    return key_env, key_file, key or None


def _read(r: Reader, name: str, where: str, env: Mapping[str, str], base: Path) -> str | None:
    """The key in a file, without the line end an editor or ``echo`` leaves; ``${VAR}`` in the
    name comes from the environment, and a relative name is relative to the routes file."""
    missing = [v for v in _VARIABLE.findall(name) if not env.get(v)]
    if missing:
        r.problem(where, f"names ${{{missing[0]}}}, which is not set (under systemd, "
                  "LoadCredential= sets $CREDENTIALS_DIRECTORY)")
        return None
    path = base / _VARIABLE.sub(lambda m: env[m.group(1)], name)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_KEY_FILE + 1)
    except OSError as exc:
        r.problem(where, f"cannot read {os.fspath(path)}: {exc.strerror or exc}")
        return None
    if len(raw) > MAX_KEY_FILE:
        r.problem(where, f"{os.fspath(path)} is larger than {MAX_KEY_FILE} bytes: not a key file")
        return None
    try:
        return raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        r.problem(where, f"{os.fspath(path)} is not UTF-8 text")
        return None
