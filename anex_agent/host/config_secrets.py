"""Secrets given to a command: from a flag, a file, or the environment, parsed once at the edge.

Every secret flag ``--X`` has a twin ``--X-file FILE`` and every secret variable
``ANEX_Y`` a twin ``ANEX_Y_FILE``: the file is read once, surrounding white space is
stripped, and an empty or unreadable file is a ConfigError naming the flag or variable.
A secret given on the command line still works but logs a warning: the command line of
every process is visible to every user of the host (``ps``, ``/proc/PID/cmdline``),
while the environment and a 0600 file are not.

Precedence: flag, flag file, variable, variable file. Giving both members of one pair
(``--token`` and ``--token-file``) is a ConfigError.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from anex_agent.errors import ConfigError

log = logging.getLogger(__name__)


def read_secret_file(path: str | Path, source: str) -> str:
    """The stripped content of ``path``; ConfigError naming ``source`` when unreadable or empty."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(source, f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(source, f"{path}: is a directory, expected a file holding the secret") from None
    except PermissionError:
        raise ConfigError(source, f"{path}: not readable by this user") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(source, f"{path}: cannot be read ({err})") from None
    secret = text.strip()
    if not secret:
        raise ConfigError(source, f"{path} is empty; expected the secret on its first line")
    return secret


def warn_command_line(flag: str, file_flag: str, var: str | None = None) -> None:
    """Log that ``flag`` put a secret on the command line, and what to use instead."""
    instead = f"{file_flag} FILE" + (f" or the {var} environment variable" if var else "")
    log.warning("%s on the command line is visible to every user of this host (ps, /proc/PID/cmdline); "
                "use %s instead", flag, instead)


@dataclass(frozen=True)
class SecretSpec:
    """Where one secret may come from: a flag and its file twin, a variable and its file twin.

    ``file_flag`` defaults to ``<flag>-file``; give it for a secret that has only the file flag.
    """

    flag: str | None
    var: str | None
    file_flag: str | None = None

    def __post_init__(self) -> None:
        if self.file_flag is None and self.flag:
            object.__setattr__(self, "file_flag", f"{self.flag}-file")

    @property
    def file_var(self) -> str | None:
        return f"{self.var}_FILE" if self.var else None


def pick_secret(
    spec: SecretSpec,
    environ: Mapping[str, str],
    *,
    flag_value: str | None = None,
    file_value: str | Path | None = None,
) -> tuple[str | None, str | None]:
    """Return ``(secret, source)``; ``(None, None)`` when no source is set. See the module contract."""
    if flag_value not in (None, "") and file_value not in (None, ""):
        raise ConfigError(spec.flag or "", f"give either {spec.flag} or {spec.file_flag}, not both")
    if flag_value not in (None, ""):
        assert spec.flag and spec.file_flag, "this secret has no command-line flag"
        warn_command_line(spec.flag, spec.file_flag, spec.var)
        secret = str(flag_value).strip()
        if not secret:
            raise ConfigError(spec.flag, "is empty")
        return secret, spec.flag
    if file_value not in (None, ""):
        assert spec.file_flag
        return read_secret_file(file_value, spec.file_flag), spec.file_flag
    if spec.var is None:
        return None, None
    assert spec.file_var
    value, path = environ.get(spec.var, ""), environ.get(spec.file_var, "")
    if value.strip() and path:
        raise ConfigError(spec.var, f"set either {spec.var} or {spec.file_var}, not both")
    if value.strip():
        return value.strip(), spec.var
    if path:
        return read_secret_file(path, spec.file_var), spec.file_var
    return None, None
