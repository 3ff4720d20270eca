"""Actions of the cluster on the workload, on the agent API: signal, restart, push a file.

Routes (:func:`add_routes`); each needs a single-use cluster access token **also on
loopback** (:attr:`anex_agent.agent.api.AgentApi.always_authenticated`): the workload is
local and must not act on itself through the agent (e.g. write files as the agent's user):

* ``POST /signal?name=TERM`` (TERM, INT, HUP, QUIT, USR1, USR2, WINCH, KILL): sent to the
  workload as if the agent had received it (TERM/INT/HUP/QUIT start the grace period; KILL
  kills its process group). 202 ``{"signal": "SIGTERM"}``.
* ``POST /restart``: stop the workload like a SIGTERM (grace period) and start it again;
  202. The state's ``restart_count`` grows.
* ``PUT /files?path=/ABS/PATH&mode=0644`` with the file as the body: written atomically
  (a temporary file in the same directory, fsync, rename) with that mode, at most
  ``max_bytes`` (413 beyond); 201 ``{"path", "bytes", "mode"}``. The path must be absolute,
  without ``..``, NUL or empty components, inside one of the configured directories
  (``ANEX_PUSH_DIRS``; none: every push is refused). It is resolved component by component
  from that directory with ``O_NOFOLLOW``, so no symbolic link (a directory or the file
  itself) leads outside; missing directories are not created (409). When the workload runs
  as another account (``--user``), the file is that account's (owner and group), as if the
  workload had written it; else it is the agent's.

Without a workload (``daemon``): 404. Workload not running: 409. Bad parameters: 400 naming
the field. Errors are RFC 9457 problem documents.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
from collections.abc import Callable, Sequence
from pathlib import PurePosixPath

from anex_agent.errors import AnexError
from anex_agent.net.http.server import Request, Response, json_response, problem

log = logging.getLogger(__name__)

SIGNALS = {name: getattr(signal, f"SIG{name}") for name in ("TERM", "INT", "HUP", "QUIT", "USR1", "USR2", "WINCH", "KILL")}
DEFAULT_MAX_BYTES = 16 << 20
ACTION_PATHS = frozenset({"/signal", "/restart", "/files"})


class PushRefused(AnexError):
    def __init__(self, status: int, detail: str, field: str = "path") -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.field = field


def _problem(status: int, detail: str, **extra) -> Response:
    titles = {400: "Bad Request", 403: "Forbidden", 404: "Not Found", 409: "Conflict", 413: "Content Too Large"}
    return problem(status, titles.get(status, "Error"), detail, **extra)


def parse_mode(text: str) -> int:
    if not (3 <= len(text) <= 4 and text.isascii() and all(c in "01234567" for c in text)):
        raise PushRefused(400, f"{text!r} is not an octal file mode such as 0644", "mode")
    mode = int(text, 8)
    if mode & 0o7000:
        raise PushRefused(400, f"{text!r}: setuid, setgid and sticky bits are not accepted", "mode")
    return mode


def confine(roots: Sequence[str], path: str) -> tuple[str, list[str], str]:
    """(root, directories below it, file name) for ``path``; PushRefused when it is not inside a root."""
    if not roots:
        raise PushRefused(403, "pushing files is off: no directory is configured (ANEX_PUSH_DIRS)")
    if "\0" in path or not path.startswith("/"):
        raise PushRefused(400, f"{path!r} is not an absolute path")
    parts = path.split("/")[1:]
    if any(p in ("", ".", "..") for p in parts):
        raise PushRefused(400, f"{path!r}: empty, '.' and '..' components are not accepted")
    for root in roots:
        root_parts = PurePosixPath(root).parts[1:]
        if not root_parts or not root.startswith("/"):
            continue  # "" or "/" would hold every path: never a root to push into
        if len(parts) > len(root_parts) and tuple(parts[:len(root_parts)]) == root_parts:
            below = parts[len(root_parts):]
            return root, below[:-1], below[-1]
    raise PushRefused(403, f"{path!r} is outside the directories files may be pushed to: {', '.join(roots)}")


def write_confined(roots: Sequence[str], path: str, chunks: list[bytes], mode: int,
                   owner: tuple[int, int] | None = None) -> int:
    """Write ``chunks`` to ``path`` atomically with ``mode`` and, when given, ``owner`` (uid,
    gid) (see the module docstring); bytes written."""
    root, dirs, name = confine(roots, path)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(root, flags)
    except OSError as err:
        raise PushRefused(409, f"the directory {root} cannot be opened: {err.strerror}") from None
    try:
        for part in dirs:
            try:
                nxt = os.open(part, flags, dir_fd=fd)
            except OSError as err:
                raise PushRefused(409 if err.errno == 2 else 403,
                                  f"{path!r}: {part!r} is not a directory inside {root} ({err.strerror})") from None
            os.close(fd)
            fd = nxt
        tmp = f".{name}.anex-{secrets.token_hex(6)}"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
        try:
            written = 0
            for chunk in chunks:
                view = memoryview(chunk)
                while view:
                    n = os.write(out, view)
                    view = view[n:]
                    written += n
            if owner is not None:
                os.fchown(out, *owner)
            os.fchmod(out, mode)
            os.fsync(out)
        except BaseException:
            os.close(out)
            os.unlink(tmp, dir_fd=fd)
            raise
        os.close(out)
        try:
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)  # replaces a symlink itself, never its target
        except OSError as err:
            os.unlink(tmp, dir_fd=fd)
            raise PushRefused(409, f"{path!r} cannot be replaced: {err.strerror}") from None
        return written
    finally:
        os.close(fd)


def add_routes(api, workload: Callable[[], object | None], *, push_dirs: Sequence[str] = (),
               max_bytes: int = DEFAULT_MAX_BYTES, on_pushed: Callable[[str], None] | None = None) -> None:
    """Add the action routes to ``api`` (an :class:`~anex_agent.agent.api.AgentApi`); ``on_pushed(path)``
    is called after each file written (:mod:`.pod_files` waits for the pod's)."""
    api.always_authenticated |= ACTION_PATHS

    def running():
        current = workload()
        if current is None:
            return None, _problem(404, "this agent runs no workload (anex-agent daemon)")
        if current.proc is None or current.proc.returncode is not None:
            return None, _problem(409, "the workload is not running")
        return current, None

    async def send_signal(request: Request) -> Response:
        name = request.query.get("name", "").upper().removeprefix("SIG")
        if name not in SIGNALS:
            return _problem(400, f"{request.query.get('name', '')!r} is not accepted; expected one of "
                                 f"{', '.join(SIGNALS)}", field="name")
        current, problem = running()
        if problem is not None:
            return problem
        log.info("agent API: the cluster sends SIG%s to the workload", name)
        if name == "KILL":
            current.kill_group()
        else:
            current.forward(SIGNALS[name])
        return json_response({"signal": f"SIG{name}"}, status=202)

    async def restart(request: Request) -> Response:
        current, problem = running()
        if problem is not None:
            return problem
        current.restart()
        return json_response({"restarting": True, "grace_seconds": current.grace}, status=202)

    async def push(request: Request) -> Response:
        path = request.query.get("path", "")
        try:
            mode = parse_mode(request.query.get("mode", "0644"))
            confine(push_dirs, path)
            if request.content_length is not None and request.content_length > max_bytes:
                raise PushRefused(413, f"the file is larger than {max_bytes} bytes", "body")
            chunks, size = [], 0
            async for chunk in request.chunks():
                size += len(chunk)
                if size > max_bytes:
                    raise PushRefused(413, f"the file is larger than {max_bytes} bytes", "body")
                chunks.append(chunk)
            account = getattr(workload(), "account", None)
            owner = (account.uid, account.gid) if account is not None else None
            written = write_confined(push_dirs, path, chunks, mode, owner)
        except PushRefused as err:
            return _problem(err.status, err.detail, field=err.field)
        log.info("agent API: the cluster pushed %s (%d bytes, mode %o%s)", path, written, mode,
                 f", owner {account.name}" if account is not None else "")
        if on_pushed is not None:
            on_pushed(path)
        return json_response({"path": path, "bytes": written, "mode": f"{mode:04o}"}, status=201)

    api.app.router.add_post("/signal", send_signal)
    api.app.router.add_post("/restart", restart)
    api.app.router.add_put("/files", push)
