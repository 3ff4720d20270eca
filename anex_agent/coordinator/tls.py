"""The coordinator's own HTTPS: a server TLS context from ``--tls-cert`` and ``--tls-key``.

Contract: :func:`server_ssl_context` returns a context for TLS 1.2 or newer, or raises
ConfigError naming the flag whose file is missing, unreadable, not PEM, encrypted (a
key needs no passphrase: the coordinator starts unattended), or does not match the
other. Both flags or neither (:func:`check_pair`).
"""

from __future__ import annotations

import ssl
from pathlib import Path

from anex_agent.errors import ConfigError


def check_pair(cert: Path | None, key: Path | None) -> None:
    """ConfigError unless both or neither of ``--tls-cert``/``--tls-key`` are given."""
    if (cert is None) != (key is None):
        missing = "--tls-key" if key is None else "--tls-cert"
        given = "--tls-cert" if key is None else "--tls-key"
        raise ConfigError(missing, f"is required with {given}: HTTPS needs the certificate chain and its private key")


def _read(path: Path, flag: str, marker: str, what: str) -> None:
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        raise ConfigError(flag, f"{path}: no such file") from None
    except PermissionError:
        raise ConfigError(flag, f"{path}: not readable by this user") from None
    except OSError as err:
        raise ConfigError(flag, f"{path}: cannot be read ({err.strerror})") from None
    if marker not in text:
        raise ConfigError(flag, f"{path}: expected {what} in PEM form")


def server_ssl_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context serving ``cert`` (the chain, leaf first) with ``key``; see the module contract."""
    _read(cert, "--tls-cert", "-----BEGIN CERTIFICATE-----", "a certificate chain")
    _read(key, "--tls-key", "PRIVATE KEY-----", "a private key")

    def no_passphrase() -> bytes:
        raise ConfigError("--tls-key", f"{key} is encrypted; give an unencrypted key (mode 0600)")

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(cert), str(key), password=no_passphrase)
    except ssl.SSLError as err:
        if "KEY_VALUES_MISMATCH" in str(err) or "key values mismatch" in str(err):
            raise ConfigError("--tls-key", f"{key} does not match the certificate in {cert}") from None
        raise ConfigError("--tls-cert/--tls-key", f"cannot load {cert} with {key}: {err.reason or err}") from None
    return context
