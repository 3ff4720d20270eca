"""The README's commands do what its text says: its gateway join token outlives the gateway's
restarts, and its coordinator is reachable by the nodes of its own example (TLS)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import aiohttp
import pytest

from anex_agent.wire import keys
from anex_agent.admin import cli as admin_cli
from anex_agent.admin.resources import tokens_create
from anex_agent.errors import CoordinatorError

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def readme_command(start: str) -> list[str]:
    """The README's one command line starting with ``start`` (continuation lines joined), as argv."""
    lines = README.splitlines()
    (i,) = [n for n, line in enumerate(lines) if line.strip().startswith(start)]
    text = lines[i].strip()
    while text.endswith("\\"):
        i += 1
        text = text[:-1] + " " + lines[i].strip()
    return shlex.split(text, comments=True)


class HarnessApi:
    """What tokens_create needs of the admin CLI's API: the harness coordinator, over HTTP."""

    def __init__(self, coord) -> None:
        self.coord = coord

    async def call(self, method: str, path: str, *, body=None, fields=None):
        headers = {"Authorization": f"Bearer {self.coord.ctx.admin_token}"}
        async with aiohttp.ClientSession() as session:
            async with session.request(method, self.coord.url + path, headers=headers, json=body) as resp:
                assert resp.status == 201, await resp.text()
                return await resp.json()


async def create_as_the_readme_does(coord, kind: str, tmp_path: Path) -> str:
    argv = readme_command(f"anex-agent admin tokens create --kind {kind}")[2:]  # from "tokens"
    parser = argparse.ArgumentParser()
    admin_cli.configure(parser)
    args = parser.parse_args(argv)
    args.out = str(tmp_path / Path(args.out).name)
    await tokens_create(HarnessApi(coord), args)
    return Path(args.out).read_text().strip()


async def test_the_readme_gateway_token_outlives_the_default_hour_and_admits_a_replacement(coord, tmp_path):
    token = await create_as_the_readme_does(coord, "gateway", tmp_path)
    pair = keys.KeyPair(keys.generate_private_key())
    first = await coord.client().register_gateway(token, pair, "gw-a", endpoint="192.0.2.1:51820")
    coord.clock.advance(30 * 86400)  # a month later: far past a default token's hour
    again = await coord.client().register_gateway(token, pair, "gw-a", endpoint="192.0.2.1:51820")
    assert again.gateway_id == first.gateway_id  # the restarted gateway registered again
    second = await coord.client().register_gateway(token, keys.KeyPair(keys.generate_private_key()), "gw-b",
                                                   endpoint="192.0.2.2:51820")
    assert second.gateway_id != first.gateway_id  # a replacement or second gateway too


async def test_a_default_gateway_token_would_not_have_outlived_the_hour(coord):
    """The contrast the README's text explains: the defaults are single-use for an hour."""
    token = (await coord.admin.create_join_token("gateway")).token
    pair = keys.KeyPair(keys.generate_private_key())
    await coord.client().register_gateway(token, pair, "gw-a", endpoint="192.0.2.1:51820")
    coord.clock.advance(2 * 3600)
    with pytest.raises(CoordinatorError) as err:
        await coord.client().register_gateway(token, pair, "gw-a", endpoint="192.0.2.1:51820")
    assert err.value.status == 401 and err.value.problem["reason"] == "expired"


def test_the_readme_coordinator_listens_where_its_nodes_reach_it_and_with_tls():
    command = readme_command("anex-agent coordinator")
    assert command[command.index("--listen") + 1] == "0.0.0.0:8700"
    assert "--tls-cert" in command and "--tls-key" in command
    assert "ANEX_COORDINATOR_URL=https://" in README
