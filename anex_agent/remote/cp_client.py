"""``anex-agent cp SRC DST``: copy files to or from a node over SFTP (what ``kubectl cp`` does).

One of SRC and DST is ``NODE:PATH`` (a node id or unique name; a relative PATH starts in the
workload's working directory), the other a local path; ``-r`` copies directories. The key,
certificate and host verification are those of ``anex-agent ssh`` (:mod:`anex_agent.remote.ssh_client`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from anex_agent.errors import ConfigError, CoordinatorError
from anex_agent.remote.ssh_client import (FAILED, add_coordinator_arguments, certify, connect, coordinator_client,
                                   describe_os_error, failure, quiet_asyncssh)


def configure(parser: argparse.ArgumentParser) -> None:
    add_coordinator_arguments(parser)
    parser.add_argument("-r", action="store_true", dest="recursive", help="copy directories")
    parser.add_argument("source", metavar="SRC", help="NODE:PATH or a local path")
    parser.add_argument("destination", metavar="DST", help="NODE:PATH or a local path")


def split_remote(spec: str) -> tuple[str, str] | None:
    """``(node, path)`` for ``NODE:PATH``; None for a local path (one with a ``/`` before any ``:``)."""
    node, colon, path = spec.partition(":")
    if not colon or not node or "/" in node:
        return None
    return node, path or "."


async def run(args: argparse.Namespace) -> int:
    import asyncssh

    src, dst = split_remote(args.source), split_remote(args.destination)
    if (src is None) == (dst is None):
        raise ConfigError("SRC DST", "exactly one of them must be NODE:PATH")
    node = (src or dst)[0]
    client = coordinator_client(args)
    try:
        target = await certify(client, node, validity=args.validity)
    finally:
        await client.close()
    try:
        conn = await connect(target)
    except (asyncssh.Error, OSError, TimeoutError) as err:
        print(f"anex-agent cp: {failure(target, err)}", file=sys.stderr)
        return FAILED
    remote = f"{node}:{(src or dst)[1]}"
    try:
        async with conn, conn.start_sftp_client() as sftp:
            if src is not None:
                await sftp.get(src[1], args.destination, recurse=args.recursive, preserve=True)
            else:
                await sftp.put(args.source, dst[1], recurse=args.recursive, preserve=True)
    except asyncssh.SFTPError as err:  # the node's side: its path
        print(f"anex-agent cp: {remote}: {err.reason or type(err).__name__}", file=sys.stderr)
        return 1
    except OSError as err:  # this machine's side: the path in the error (bytes from asyncssh) as text
        print(f"anex-agent cp: {describe_os_error(err)}", file=sys.stderr)
        return 1
    except (asyncssh.Error, TimeoutError) as err:
        print(f"anex-agent cp: {failure(target, err)}", file=sys.stderr)
        return 1
    return 0


def main(args: argparse.Namespace) -> int:
    quiet_asyncssh(getattr(args, "verbose", 0))
    try:
        return asyncio.run(run(args))
    except CoordinatorError as err:
        print(f"anex-agent cp: {err}", file=sys.stderr)
        return FAILED
