"""The kubelet port's settings, parsed once from flags (beside the virtual node's own).

==================================  ============================================================
flag                                meaning
==================================  ============================================================
``--kubelet-tls-cert FILE``         the serving certificate (PEM, with its chain); with
``--kubelet-tls-key FILE``          its key. Without both, one is asked of the cluster's CSR
                                    API (signer ``kubernetes.io/kubelet-serving``) per Node
``--kubelet-client-ca-file FILE``   the CA of client certificates (the API server's
                                    ``--kubelet-client-certificate``); without it, only bearer
                                    tokens authenticate
``--kubelet-address IP``            the address the kubelet ports listen on (default: all of
                                    this host's, as a kubelet's ``--address``); every request is
                                    authenticated and authorized all the same
``--kubelet-cert-dir DIR``          where a certificate from the CSR API and its key are kept
                                    (mode 0600; default: a fresh private temporary folder)
==================================  ============================================================

The port of the Nth Node (in ``--providers`` order) is ``--kubelet-port`` + N (the port its
Node names); the API server reaches it at the Node's InternalIP (``--internal-ip``).
"""

from __future__ import annotations

import argparse
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from anex_agent.errors import ConfigError


@dataclass(frozen=True)
class KubeletSettings:
    tls_cert: Path | None = None
    tls_key: Path | None = None
    client_ca: Path | None = None
    cert_dir: Path | None = None
    address: str = "0.0.0.0"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubelet-tls-cert", type=Path, metavar="FILE",
                        help="the kubelet port's serving certificate (PEM); default: asked of the cluster's CSR API")
    parser.add_argument("--kubelet-tls-key", type=Path, metavar="FILE", help="the key of --kubelet-tls-cert (PEM)")
    parser.add_argument("--kubelet-client-ca-file", type=Path, metavar="FILE",
                        help="CA whose client certificates the kubelet port accepts (the API server's kubelet "
                             "client certificate's CA)")
    parser.add_argument("--kubelet-address", metavar="IP",
                        help="the address the kubelet ports listen on (default: 0.0.0.0, every address)")
    parser.add_argument("--kubelet-cert-dir", type=Path, metavar="DIR",
                        help="where a serving certificate from the CSR API is kept (default: a private temporary "
                             "folder)")


def _readable(flag: str, path: Path | None) -> None:
    if path is None:
        return
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except OSError as err:
        raise ConfigError(flag, f"{path}: {err.strerror or err}; expected a readable PEM file") from None


def from_args(args: argparse.Namespace) -> KubeletSettings:
    cert, key = getattr(args, "kubelet_tls_cert", None), getattr(args, "kubelet_tls_key", None)
    if (cert is None) != (key is None):
        raise ConfigError("--kubelet-tls-cert" if cert is None else "--kubelet-tls-key",
                          "is not set; give both --kubelet-tls-cert and --kubelet-tls-key, or neither "
                          "(then the certificate is asked of the cluster's CSR API)")
    client_ca = getattr(args, "kubelet_client_ca_file", None)
    for flag, path in (("--kubelet-tls-cert", cert), ("--kubelet-tls-key", key),
                       ("--kubelet-client-ca-file", client_ca)):
        _readable(flag, path)
    cert_dir = getattr(args, "kubelet_cert_dir", None)
    if cert_dir is not None and not cert_dir.is_dir():
        raise ConfigError("--kubelet-cert-dir", f"{cert_dir}: not a folder; expected an existing folder")
    address = getattr(args, "kubelet_address", None) or "0.0.0.0"
    try:
        address = str(ipaddress.ip_address(address))
    except ValueError:
        raise ConfigError("--kubelet-address", f"{address!r}: expected an IPv4 or IPv6 address") from None
    return KubeletSettings(tls_cert=cert, tls_key=key, client_ca=client_ca, cert_dir=cert_dir, address=address)
