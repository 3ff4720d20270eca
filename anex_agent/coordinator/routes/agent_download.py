"""``GET /v1/agent/{arch}``: the single-file agent, for machines that boot it from the coordinator.

Contract:
* The files are the coordinator's ``--agent-binary [ARCH=]PATH`` (one per architecture as
  ``uname -m`` names it: ``x86_64``, ``aarch64``; a bare PATH is this machine's architecture),
  in :attr:`Settings.agent_binaries`.
* The caller presents a live node join token as ``Authorization: Bearer`` (the bootstrap
  token of a provision, or any node token): unknown, expired or missing is the one 401 (and
  counts as a failed authentication). The download does not use the token up; only a join
  does.
* The answer streams the file (``application/octet-stream``) with its SHA-256 in
  ``X-Checksum-Sha256`` (hex) and ``Digest: sha-256=<base64>`` (RFC 3230); an architecture
  the coordinator has no file for is a 404 naming ``arch`` and the ones it has.
* :func:`agent_sha256` (one architecture) and :func:`agent_sha256s` (all) are the same hashes
  for the provisioning loop (it bakes them into the start script); they are computed off the
  event loop and cached per file size and modification time.
* :data:`MIGRATIONS` carries the provision binding of join tokens
  (:data:`anex_agent.coordinator.provisioning.bootstrap.MIGRATION`).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from pathlib import Path

from aiohttp import web

from anex_agent.wire.join import TokenKind
from anex_agent.coordinator import credentials, problems, tokens
from anex_agent.coordinator.auth import Auth, bearer
from anex_agent.coordinator.provisioning.bootstrap import AGENT_PATH, MIGRATION
from anex_agent.coordinator.routes.registry import Call, Route, RouteRegistry

MIGRATIONS = [MIGRATION]
_CHUNK = 1 << 20
_digests: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> hex SHA-256


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def agent_file(settings, arch: str) -> Path | None:
    """The agent file for ``arch``, or None when the coordinator has none."""
    return dict(settings.agent_binaries).get(arch)


async def agent_sha256(settings, arch: str) -> str | None:
    """The hex SHA-256 of the agent file for ``arch`` (None: no such file configured)."""
    path = agent_file(settings, arch)
    if path is None:
        return None
    stat = await asyncio.to_thread(path.stat)
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _digests:
        _digests[key] = await asyncio.to_thread(_hash_file, path)
    return _digests[key]


async def agent_sha256s(settings) -> dict[str, str]:
    """Every configured architecture's agent hash: what a start script bakes in."""
    out = {}
    for arch, _path in settings.agent_binaries:
        digest = await agent_sha256(settings, arch)
        if digest is not None:
            out[arch] = digest
    return out


async def download_agent(call: Call) -> web.StreamResponse:
    ctx = call.ctx
    secret = bearer(call.request)
    if secret is None or not credentials.has_prefix(secret, credentials.JOIN_TOKEN):
        raise problems.unauthenticated()
    await tokens.lookup(ctx.db, secret, TokenKind.node, now=ctx.clock())
    arch = call.param("arch")
    path = agent_file(ctx.settings, arch)
    if path is None:
        have = ", ".join(sorted(dict(ctx.settings.agent_binaries))) or "none (start the coordinator with --agent-binary)"
        raise problems.Problem(404, "Not Found", f"no agent file for architecture {arch!r}; available: {have}",
                               slug="not-found", errors=[{"field": "arch", "message": f"available: {have}"}])
    hexdigest = await agent_sha256(ctx.settings, arch)
    assert hexdigest is not None
    return web.FileResponse(path, headers={
        "Content-Type": "application/octet-stream",
        "X-Checksum-Sha256": hexdigest,
        "Digest": "sha-256=" + base64.b64encode(bytes.fromhex(hexdigest)).decode(),
        "Cache-Control": "no-store",
    })


def setup(registry: RouteRegistry, ctx) -> None:
    registry.add(Route(
        "GET", AGENT_PATH + "/{arch}", download_agent, Auth.public,
        "Download the single-file agent for an architecture (uname -m); a node join token as bearer",
        content_type="application/octet-stream", problems=(401, 404, 429), tags=("provisioning",),
    ))
