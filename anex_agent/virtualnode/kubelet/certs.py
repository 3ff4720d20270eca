"""The kubelet port's serving certificate: from files, or from the cluster's CSR API.

From the CSR API (no ``--kubelet-tls-cert``), as a kubelet with server-certificate rotation
does: a fresh ECDSA P-256 key (never leaves this process's folder, mode 0600), a
CertificateSigningRequest with signer ``kubernetes.io/kubelet-serving``, subject
``CN=system:node:<node>``, ``O=system:nodes``, SANs the Node's InternalIP and its name, usages
``digital signature`` and ``server auth``. Nothing approves it automatically: an admin runs
``kubectl certificate approve <name>`` (the name is logged) and kube-controller-manager signs it
with the cluster CA (the CA the API server's ``--kubelet-certificate-authority`` names).
The certificate is asked again at 80 % of its life (:func:`renew_at`) and swapped into the
listener's TLS context; connections already open keep the old one.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from anex_agent.backoff import Backoff
from anex_agent.errors import KubeError
from anex_agent.host.private_file import write_private

log = logging.getLogger(__name__)

SIGNER = "kubernetes.io/kubelet-serving"
RENEW_FRACTION = 0.8
POLL = 2.0  # seconds between reads of a CSR waiting for approval


@dataclass(frozen=True)
class Issued:
    cert_file: Path
    key_file: Path
    not_before: float
    not_after: float


def renew_at(not_before: float, not_after: float) -> float:
    """When to ask again: 80 % of the way through the certificate's life (pure)."""
    return not_before + RENEW_FRACTION * (not_after - not_before)


def make_request(node_name: str, internal_ip: str) -> tuple[bytes, bytes]:
    """(PEM CSR, PEM private key) for ``node_name`` at ``internal_ip``."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                         x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node_name}")])
    sans = x509.SubjectAlternativeName([x509.DNSName(node_name), x509.IPAddress(ipaddress.ip_address(internal_ip))])
    csr = x509.CertificateSigningRequestBuilder().subject_name(subject).add_extension(sans, critical=False) \
        .sign(key, hashes.SHA256())
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return csr.public_bytes(serialization.Encoding.PEM), key_pem


def validity(cert_pem: bytes) -> tuple[float, float]:
    cert = x509.load_pem_x509_certificate(cert_pem)
    return cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp()


def from_files(cert_file: Path, key_file: Path) -> Issued:
    not_before, not_after = validity(cert_file.read_bytes())
    return Issued(cert_file, key_file, not_before, not_after)


class CsrIssuer:
    """Asks the cluster's CSR API for Node ``node_name``'s serving certificate (module docstring)."""

    def __init__(self, kube: Any, node_name: str, internal_ip: str, folder: Path | None,
                 clock: Callable[[], float] = time.time) -> None:
        from kubernetes_asyncio import client

        self.kube = kube  # a virtualnode.kube.KubeApi
        self.certificates = client.CertificatesV1Api(kube.api_client)
        self.node_name = node_name
        self.internal_ip = internal_ip
        self.folder = folder
        self.clock = clock

    def _folder(self) -> Path:
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="anex-kubelet-"))
            os.chmod(self.folder, 0o700)
        return self.folder

    async def issue(self) -> Issued:
        """A signed certificate; waits (logging the approval command once) until one is issued.
        A denied or failed request is asked again after a backoff."""
        backoff = Backoff(base=5.0, cap=300.0)
        while True:
            try:
                issued = await self._one()
                if issued is not None:
                    return issued
            except KubeError as err:
                log.error("kubelet port of %s: the serving certificate could not be asked for: %s",
                          self.node_name, err)
            await asyncio.sleep(backoff.next_delay())

    async def _one(self) -> Issued | None:
        csr_pem, key_pem = make_request(self.node_name, self.internal_ip)

        body = {"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
                "metadata": {"generateName": "csr-", "labels": {"anex.sh/node": self.node_name}},
                "spec": {"request": base64.b64encode(csr_pem).decode(), "signerName": SIGNER,
                         "usages": ["digital signature", "server auth"]}}
        made = await self.kube._json("create", "certificatesigningrequests",
                                     self.certificates.create_certificate_signing_request, body) or {}
        name = str((made.get("metadata") or {}).get("name") or "")
        log.warning("kubelet port of %s: waiting for its serving certificate; approve it with: "
                    "kubectl certificate approve %s", self.node_name, name)
        while True:
            doc = await self.kube._json("get", "certificatesigningrequests",
                                        self.certificates.read_certificate_signing_request, name,
                                        missing_ok=True)
            if doc is None:
                log.error("kubelet port of %s: the certificate request %s was deleted", self.node_name, name)
                return None
            status = doc.get("status") or {}
            kinds = {c.get("type") for c in status.get("conditions") or ()}
            if kinds & {"Denied", "Failed"}:
                log.error("kubelet port of %s: the certificate request %s was %s", self.node_name, name,
                          "denied" if "Denied" in kinds else "not signed (Failed)")
                return None
            if status.get("certificate"):
                cert_pem = base64.b64decode(status["certificate"])
                folder = self._folder()
                cert_file, key_file = folder / f"{self.node_name}.crt", folder / f"{self.node_name}.key"
                write_private(key_file, key_pem.decode())
                write_private(cert_file, cert_pem.decode())
                not_before, not_after = validity(cert_pem)
                log.info("kubelet port of %s: serving certificate %s issued, valid until %s", self.node_name, name,
                         datetime.datetime.fromtimestamp(not_after, datetime.timezone.utc).isoformat())
                return Issued(cert_file, key_file, not_before, not_after)
            await asyncio.sleep(POLL)
