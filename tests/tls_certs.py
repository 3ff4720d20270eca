"""A throwaway CA and a server certificate, for the tests of HTTPS and TLS-terminating front ends.

Contract: :func:`make_certs` writes into ``directory`` a CA certificate (``ca.pem``) and a
server certificate (``cert.pem``, for the IP address ``ip`` and the DNS names ``dns_names``,
valid for a day) signed by it, with its key (``key.pem``), a key that does not match it
(``other-key.pem``) and its key under the passphrase ``passphrase`` (``encrypted-key.pem``);
the key files are 0600. A client trusting ``ca.pem`` verifies the server certificate.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Certs:
    ca: Path
    cert: Path
    key: Path
    other_key: Path          # a key that does not match ``cert``
    encrypted_key: Path      # ``key`` under a passphrase


def _pem_key(key, password: bytes | None = None) -> bytes:
    enc = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)


def make_certs(directory: Path, *, ip: str = "127.0.0.1", dns_names: tuple[str, ...] = ("localhost",)) -> Certs:
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "anex test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ip)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([*(x509.DNSName(name) for name in dns_names),
                                                        x509.IPAddress(ipaddress.ip_address(ip))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    certs = Certs(directory / "ca.pem", directory / "cert.pem", directory / "key.pem", directory / "other-key.pem",
                  directory / "encrypted-key.pem")
    certs.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    certs.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    certs.key.write_bytes(_pem_key(key))
    certs.other_key.write_bytes(_pem_key(ec.generate_private_key(ec.SECP256R1())))
    certs.encrypted_key.write_bytes(_pem_key(key, b"passphrase"))
    for path in (certs.key, certs.other_key, certs.encrypted_key):
        path.chmod(0o600)
    return certs
