"""A provision's registry login (a pod's ``imagePullSecrets``), sealed in the coordinator's database.

The provider needs the login each time it rents for the provision (retries and replacements
included), so the coordinator keeps it, but never in clear: the database holds it sealed with
AES-256-GCM under a key derived (HKDF-SHA256) from the coordinator's access-token signing key,
which lives in the state directory (every coordinator of one database shares that key already:
:mod:`anex_agent.coordinator.signing`), with the provision's name as associated data (a sealed
login copied to another provision does not open). A copy of the database alone opens nothing.

* :func:`seal` / :func:`unseal`: the column ``provisions.registry_auth`` (migration 470);
* :func:`fingerprint`: an HMAC of the login under the same key, which joins the provision's body
  hash (``POST /v1/provisions`` is idempotent by body) without a plain hash of the password;
  also the name under which a provider that stores logins itself (RunPod) keeps this one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from anex_agent.coordinator.migrations import Migration
from anex_agent.errors import AnexError
from anex_agent.providers.rentals import RegistryLogin
from anex_agent.wire.provisioning import RegistryAuth

MIGRATION = Migration(470, "provisioning: a provision's registry login, sealed", """
    ALTER TABLE provisions ADD COLUMN registry_auth TEXT
""")

VERSION = "v1"
_INFO_SEAL = b"anex provision registry login: seal"
_INFO_MAC = b"anex provision registry login: fingerprint"


class SealError(AnexError):
    """A sealed login that does not open (another key, another provision, damaged)."""


def _key(signing_key: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(signing_key)


def _plain(login: RegistryAuth) -> bytes:
    return json.dumps({"server": login.server, "username": login.username, "password": login.password},
                      sort_keys=True, separators=(",", ":")).encode()


def seal(signing_key: bytes, login: RegistryAuth, name: str) -> str:
    nonce = os.urandom(12)
    box = AESGCM(_key(signing_key, _INFO_SEAL)).encrypt(nonce, _plain(login), name.encode())
    return f"{VERSION}:{base64.b64encode(nonce + box).decode()}"


def unseal(signing_key: bytes, sealed: str, name: str) -> RegistryLogin:
    version, _, blob = sealed.partition(":")
    try:
        if version != VERSION:
            raise ValueError(version)
        raw = base64.b64decode(blob, validate=True)
        plain = AESGCM(_key(signing_key, _INFO_SEAL)).decrypt(raw[:12], raw[12:], name.encode())
        doc = json.loads(plain)
        login = RegistryAuth(**doc)
    except Exception:  # noqa: BLE001 - any failure is one answer: it does not open
        raise SealError(f"the registry login of provision {name} does not open with this coordinator's signing "
                        "key (another key, or damaged)") from None
    return RegistryLogin(login.server, login.username, login.password, fingerprint(signing_key, login))


def fingerprint(signing_key: bytes, login: RegistryAuth) -> str:
    return hmac.new(_key(signing_key, _INFO_MAC), _plain(login), hashlib.sha256).hexdigest()
