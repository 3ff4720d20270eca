"""Key handling: generation, base64 form, state-file permissions."""

import base64
import os
import subprocess
import shutil

import pytest

from anex_agent.wire import keys
from anex_agent.errors import ConfigError


def test_public_key_matches_wg_pubkey_when_available(tmp_path):
    pair = keys.load_or_create(tmp_path / "wg.key")
    if shutil.which("wg") is None:
        pytest.skip("wg (wireguard-tools) not installed")
    out = subprocess.run(["wg", "pubkey"], input=pair.private_b64 + "\n", capture_output=True, text=True, check=True)
    assert out.stdout.strip() == pair.public_b64


def test_key_file_is_created_0600_and_reused(tmp_path):
    path = tmp_path / "state" / "wg.key"
    first = keys.load_or_create(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert keys.load_or_create(path).public == first.public


def test_group_readable_key_file_is_refused(tmp_path):
    path = tmp_path / "wg.key"
    keys.load_or_create(path)
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="0600"):
        keys.load_or_create(path)


@pytest.mark.parametrize("text", ["not base64!", base64.b64encode(b"x" * 31).decode(), ""])
def test_malformed_keys_name_the_input(text):
    with pytest.raises(ConfigError, match="peer key"):
        keys.decode_key(text, what="peer key")


def test_repr_never_shows_private_key(tmp_path):
    pair = keys.load_or_create(tmp_path / "k")
    assert pair.private_b64 not in repr(pair)
