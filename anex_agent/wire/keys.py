"""WireGuard key handling: X25519 key pairs in WireGuard's base64 text form.

Contract: a key's text form is standard base64 of exactly 32 bytes (44 characters
ending in ``=``), as ``wg genkey`` / ``wg pubkey`` print it. Private keys are only
ever written to the node's own state directory with mode 0600 and never leave it.
"""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from anex_agent.errors import ConfigError

KEY_LEN = 32


def decode_key(text: str, *, what: str = "key") -> bytes:
    """Return the 32 raw bytes of a base64 WireGuard key, or raise ConfigError naming ``what``."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError, AttributeError):
        raise ConfigError(what, "is not valid base64; expected 44 characters of base64 (32 bytes)") from None
    if len(raw) != KEY_LEN:
        raise ConfigError(what, f"decodes to {len(raw)} bytes; a WireGuard key is 32 bytes (44 base64 characters)")
    return raw


def encode_key(raw: bytes) -> str:
    """Return the base64 text form of 32 raw key bytes."""
    if len(raw) != KEY_LEN:
        raise ValueError(f"a WireGuard key is 32 bytes, got {len(raw)}")
    return base64.b64encode(raw).decode("ascii")


def generate_private_key() -> bytes:
    """Return a fresh, clamped X25519 private key (32 bytes)."""
    key = X25519PrivateKey.generate()
    return key.private_bytes_raw()


def public_key(private: bytes) -> bytes:
    """Return the X25519 public key (32 bytes) of a private key."""
    return (
        X25519PrivateKey.from_private_bytes(private)
        .public_key()
        .public_bytes_raw()
    )


class KeyPair:
    """A node's WireGuard identity. ``public_b64`` is the only part that may leave the node."""

    __slots__ = ("private", "public")

    def __init__(self, private: bytes) -> None:
        self.private = private
        self.public = public_key(private)

    @property
    def public_b64(self) -> str:
        return encode_key(self.public)

    @property
    def private_b64(self) -> str:
        """For local configuration only (UAPI socket, netlink, a 0600 config file)."""
        return encode_key(self.private)

    def __repr__(self) -> str:  # never print the private key
        return f"KeyPair(public={self.public_b64})"


def load_or_create(path: Path) -> KeyPair:
    """Load the private key at ``path``, creating it (mode 0600, parent 0700) on first use.

    The file holds the base64 private key and a newline, like ``wg genkey`` output.
    A file readable by group or others is refused, as is a malformed key.
    """
    path = Path(path)
    if path.exists():
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise ConfigError(str(path), f"private key file has mode {mode:o}; it must be 0600 (chmod 600 {path})")
        return KeyPair(decode_key(path.read_text(), what=str(path)))
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    private = generate_private_key()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(encode_key(private) + "\n")
    return KeyPair(private)
