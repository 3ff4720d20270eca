"""The coordinator's two registered keys (join-proof X25519 key, access-token Ed25519 key)
kept in 0600 files: each named in its own words, both held to the same rules (SQLite and
PostgreSQL for the registration)."""

from __future__ import annotations

import base64

import pytest

from anex_agent.wire import access_token, keys
from anex_agent.coordinator import coordinator_key, signing
from anex_agent.errors import ConfigError

KINDS = [
    pytest.param(coordinator_key, "coordinator key", "X25519", "coordinator-key", id="coordinator-key"),
    pytest.param(signing, "signing key", "Ed25519", "access-token-signing-key", id="signing-key"),
]


@pytest.mark.parametrize("module, label, algorithm, file_name", KINDS)
def test_created_0600_then_read_back_and_refused_when_open_or_malformed(tmp_path, module, label, algorithm, file_name):
    path = tmp_path / "state" / file_name
    created = module.load_or_create(path)
    assert len(created) == 32 and path.stat().st_mode & 0o777 == 0o600
    assert module.load_or_create(path) == created
    path.chmod(0o640)
    with pytest.raises(ConfigError) as info:
        module.load_or_create(path)
    assert info.value.source == str(path) and f"{label} file has mode 640" in str(info.value)
    path.chmod(0o600)
    path.write_text(base64.b64encode(b"short").decode() + "\n")
    with pytest.raises(ConfigError) as info:
        module.load_or_create(path)
    assert info.value.source == str(path) and f"base64 {algorithm} private key (32 bytes)" in str(info.value)


@pytest.mark.parametrize("module, label, algorithm, file_name", KINDS)
async def test_registration_first_key_wins_and_another_is_refused(coord, tmp_path, module, label, algorithm, file_name):
    registered = await coord.ctx.db.fetchval("SELECT value FROM settings WHERE name = $1", module.SETTING)
    mine = module.load_or_create(coord.ctx.settings.state_dir / file_name)
    assert await module.register(coord.ctx.db, mine, key_path=tmp_path / "same") == registered
    other = keys.generate_private_key() if module is coordinator_key else access_token.generate_signing_key()
    with pytest.raises(ConfigError) as info:
        await module.register(coord.ctx.db, other, key_path=tmp_path / "other")
    assert info.value.source == str(tmp_path / "other")
    assert f"this {label} differs" in str(info.value) and f"copy their {file_name} file here" in str(info.value)
    assert await coord.ctx.db.fetchval("SELECT value FROM settings WHERE name = $1", module.SETTING) == registered
