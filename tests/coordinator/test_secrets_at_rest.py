"""The database never holds a private key or a plain secret: dump every table and search."""

from __future__ import annotations

import base64

from anex_agent.wire.heartbeat import Heartbeat
from anex_agent.wire.nodes import TunnelSpec
from anex_agent.coordinator import credentials


async def dump(db) -> str:
    if db.dialect == "sqlite":
        tables = [r["name"] for r in await db.fetch("SELECT name FROM sqlite_master WHERE type = 'table'")]
    else:
        tables = [r["tablename"] for r in await db.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
    assert {"nodes", "gateways", "join_tokens", "changes", "settings"} <= set(tables)
    text = []
    for table in tables:
        for row in await db.fetch(f"SELECT * FROM {table}"):
            text.append(repr(row))
    return "\n".join(text)


async def test_no_private_key_or_plain_secret_in_the_database(coord):
    node_token = await coord.admin.create_join_token(reusable=True, labels={"team": "ml"})
    gw_client, gw, gw_pair = await coord.gateway()
    node_client, joined, node_pair = await coord.join()
    rejoin_client = coord.client()
    rejoined = await rejoin_client.join(node_token.token, node_pair, "again", "onprem")
    await rejoin_client.heartbeat(joined.node_id, Heartbeat(telemetry={"gpus": []}))
    await coord.admin.put_tunnels(joined.node_id, [TunnelSpec(listen_port=80, target="a:80")])
    issued = await coord.admin.create_access_token(joined.node_id)
    await coord.ctx.heartbeats.flush()

    text = await dump(coord.ctx.db)
    secrets = {
        "node join token": node_token.token,
        "node credential": joined.credential,
        "node credential after re-join": rejoined.credential,
        "gateway credential": gw.credential,
        "admin token": coord.ctx.admin_token,
        "access token": issued.token,
        "node private key": node_pair.private_b64,
        "gateway private key": gw_pair.private_b64,
        "signing key": base64.b64encode(coord.ctx.signing_key).decode(),
    }
    for what, secret in secrets.items():
        assert secret not in text, f"{what} is stored in the database"
        # nor the secret part without its prefix
        assert secret.split("_", 1)[-1] not in text, f"{what} (without prefix) is stored in the database"
    # what is stored is the hash
    assert credentials.hash_secret(joined.credential) not in text  # rotated by the re-join
    assert credentials.hash_secret(rejoined.credential) in text
    assert credentials.hash_secret(node_token.token) in text
    assert node_pair.public_b64 in text  # public keys are fine
