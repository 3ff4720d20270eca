"""A real Kubernetes control plane on this machine: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager on 127.0.0.1, no kubelet, no container runtime. The demo's Kubernetes
rows run on it (:mod:`anex_agent.demo.kubernetes`) and so do the integration tests
(``integration/kube.py`` adds the pytest marker).

API::

    from anex_agent.testing.kube import ControlPlane, kube_skip_reason

    with ControlPlane(workdir) as cp:                        # started and ready when the block begins
        cp.create_namespace("t-1a2b3c")                      # returns once pods can be made in it
        cp.kubectl("apply", "-f", "-", input=manifest)       # CompletedProcess (check=True)
        cp.kubectl_json("get", "pod", "p", "-n", "t-1a2b3c") # parsed ``-o json`` output
        cp.kubeconfig                                        # admin kubeconfig (system:masters)
        cp.server, cp.ca_file                                # https://127.0.0.1:PORT, the cluster CA
        cp.issue_cert("vn", "system:node:vn", ["system:nodes"])  # a cert signed by the cluster CA
        cp.write_kubeconfig(path, cert, key)                 # a kubeconfig for another identity

* Programs are looked up in ``$ANEX_TOOLS_BIN_DIR`` (default ``/var/cache/anex-agent/tools/bin``,
  where ``scripts/install-tools kube etcd`` links them), then on PATH.
  :func:`kube_skip_reason` says which are missing (``None`` when all are there).
* Every port is a free loopback port picked at start; all state (etcd's data, certificates,
  kubeconfigs, each program's log ``<name>.log``) lives in ``workdir``.
* Certificates are made here with ``cryptography`` (EC P-256): the cluster CA, the API
  server's serving cert (127.0.0.1, localhost, kubernetes.default...), admin / scheduler /
  controller-manager client certs, the API server's client cert towards kubelets
  (``--kubelet-client-certificate``), the service-account signing key pair, and a front-proxy
  CA with its client cert. The API server checks kubelets' serving certs against the cluster
  CA: a test that runs a kubelet API gets one from :meth:`ControlPlane.issue_cert`.
* :meth:`ControlPlane.start` returns once the API server's ``/readyz``, the scheduler's
  ``/readyz`` and the controller manager's ``/healthz`` answer ``ok`` and the
  ``default/default`` service account exists (pods are admitted only then); each wait has
  a deadline and raises AssertionError with the tail of the program's log when it passes
  (or at once when the program exits).
* Only the controllers a test of a virtual node needs run (:data:`DEFAULT_CONTROLLERS`:
  service accounts and their tokens, namespaces, garbage collection, node lifecycle, and the
  EndpointSlices of Services, which a kube-proxy reads); pass
  ``controllers=`` for others. A Node is called Unknown (and tainted unreachable) after
  ``node_monitor_grace_period`` without heartbeats (default 5 minutes, so a slow test never
  sees it; a test of heartbeats passes a short one). Leader election is off.
* :meth:`ControlPlane.close` stops the programs (SIGTERM, then SIGKILL); the caller owns
  ``workdir``.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from anex_agent.testing.mesh import ProcessDied, wait_until

TOOLS_BIN_DIR = Path(os.environ.get("ANEX_TOOLS_BIN_DIR", "/var/cache/anex-agent/tools/bin"))
PROGRAMS = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl")
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"  # the first address of SERVICE_CIDR: the ``kubernetes`` service
#: The API server taints a new Node ``node.kubernetes.io/not-ready``; node-lifecycle-controller
#: lifts it once the Node says Ready (and taints it unreachable when its heartbeats stop).
#: endpointslice-controller lists a Service's ready pods (a rented pod's mesh address among them).
DEFAULT_CONTROLLERS = ("serviceaccount-token-controller", "serviceaccount-controller",
                       "namespace-controller", "garbage-collector-controller", "node-lifecycle-controller",
                       "endpointslice-controller")
#: How long node-lifecycle-controller waits for a Node's heartbeat (status or Lease) before it
#: calls the node Unknown: long, so that a busy machine does not make a test's node unreachable.
NODE_MONITOR_GRACE_PERIOD = "5m"
START_TIMEOUT = 120.0  # seconds for each program to become ready on a busy 2-core machine


def find_program(name: str) -> str | None:
    """The path of ``name``: in :data:`TOOLS_BIN_DIR` first, then on PATH."""
    candidate = TOOLS_BIN_DIR / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which(name)


def kube_skip_reason() -> str | None:
    """Why the control plane cannot run here (``None`` when it can)."""
    missing = [name for name in PROGRAMS if find_program(name) is None]
    if missing:
        return (f"needs {', '.join(missing)} in {TOOLS_BIN_DIR} or on PATH "
                "(build them with scripts/install-tools kube etcd)")
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Certs:
    """A CA that signs certs into a folder; each ``*_file`` is a PEM path."""

    def __init__(self, folder: Path, name: str) -> None:
        self.folder = folder
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        self.cert_file = folder / f"{name}.crt"
        write(self.cert_file, self.cert.public_bytes(serialization.Encoding.PEM))
        write(folder / f"{name}.key", private_pem(self.key))

    def issue(self, name: str, common_name: str, organizations: Sequence[str] = (), *,
              dns: Sequence[str] = (), ips: Sequence[str] = (), server: bool = False,
              client: bool = True) -> tuple[Path, Path]:
        """Sign a new key's cert; returns ``(cert_file, key_file)`` named ``name.crt/.key``."""
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (
            x509.CertificateBuilder().subject_name(x509.Name(attrs)).issuer_name(self.cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                         crl_sign=False, content_commitment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
        )
        sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_file, key_file = self.folder / f"{name}.crt", self.folder / f"{name}.key"
        write(cert_file, cert.public_bytes(serialization.Encoding.PEM))
        write(key_file, private_pem(key))
        return cert_file, key_file


def private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


class ControlPlane:
    """etcd + kube-apiserver + kube-scheduler + kube-controller-manager in ``workdir``."""

    def __init__(self, workdir: Path, *, controllers: Sequence[str] = DEFAULT_CONTROLLERS,
                 node_monitor_grace_period: str = NODE_MONITOR_GRACE_PERIOD,
                 start_timeout: float = START_TIMEOUT) -> None:
        self.workdir = Path(workdir)
        self.controllers = tuple(controllers)
        self.node_monitor_grace_period = node_monitor_grace_period
        self.start_timeout = start_timeout
        self.pki = self.workdir / "pki"
        self.procs: dict[str, subprocess.Popen] = {}
        self.server = ""
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.ca_file = self.pki / "ca.crt"
        self.start_seconds: dict[str, float] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        t0 = time.monotonic()
        self.pki.mkdir(parents=True, exist_ok=True)
        self._make_pki()
        self.start_seconds["certificates"] = time.monotonic() - t0
        etcd_url = self._start_etcd()
        self._start_apiserver(etcd_url)
        t1 = time.monotonic()
        self._start_components({"kube-scheduler": (self._scheduler_args(), "/readyz"),
                                "kube-controller-manager": (self._controller_manager_args(), "/healthz")})
        self._wait_for_default_service_account("default")
        self.start_seconds["scheduler+controller-manager"] = time.monotonic() - t1
        self.start_seconds["total"] = time.monotonic() - t0

    def close(self) -> None:
        for name, proc in reversed(list(self.procs.items())):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=15)
        for proc in self.procs.values():
            if proc.stdout is not None:
                proc.stdout.close()
        self.procs.clear()

    # -- using it ----------------------------------------------------------------------------

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess:
        """``kubectl --kubeconfig=<admin> ARGS`` (text; raises with stderr when ``check`` fails)."""
        proc = subprocess.run([self._program("kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
                              input=input, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def kubectl_json(self, *args: str) -> dict:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def create_namespace(self, name: str) -> str:
        """Create namespace ``name`` and return once pods can be made in it: the API server
        admits a pod only when its service account exists, which the controller manager
        creates a moment after the namespace."""
        self.kubectl("create", "namespace", name)
        self._wait_for_default_service_account(name)
        return name

    def _wait_for_default_service_account(self, namespace: str) -> None:
        try:
            wait_until(lambda: self.kubectl("get", "serviceaccount", "default", "-n", namespace,
                                            check=False).returncode == 0,
                       self.start_timeout, f"the default service account of namespace {namespace}", interval=0.1)
        except TimeoutError as err:
            raise AssertionError(str(err)) from None

    def issue_cert(self, name: str, common_name: str, organizations: Sequence[str] = (), *,
                   dns: Sequence[str] = (), ips: Sequence[str] = (), server: bool = False,
                   client: bool = True) -> tuple[Path, Path]:
        """A cert signed by the cluster CA (client certs authenticate as ``common_name`` in
        ``organizations``; a kubelet's serving cert needs ``server=True`` and its IPs)."""
        return self.ca.issue(name, common_name, organizations, dns=dns, ips=ips, server=server, client=client)

    def write_kubeconfig(self, path: Path, cert: Path, key: Path) -> Path:
        """A kubeconfig for this API server that authenticates with ``cert``/``key``."""
        return self._kubeconfig(path, {"client-certificate": str(cert), "client-key": str(key)})

    def service_account_kubeconfig(self, path: Path, namespace: str, name: str, duration: str = "2h") -> Path:
        """A kubeconfig (0600) that authenticates as the ServiceAccount ``namespace/name`` with a
        token from the TokenRequest API (``kubectl create token``), good for ``duration``."""
        token = self.kubectl("-n", namespace, "create", "token", name, f"--duration={duration}").stdout.strip()
        return self._kubeconfig(path, {"token": token})

    def _kubeconfig(self, path: Path, user: dict[str, str]) -> Path:
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user", "namespace": "default"}}],
        }
        write(path, json.dumps(config, indent=1).encode())  # 0600; JSON is YAML: every client reads it
        return path

    def logs(self, lines: int = 40) -> str:
        """The tail of each program's log, for a failure message."""
        parts = []
        for name in self.procs:
            path = self.workdir / f"{name}.log"
            text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
            parts.append(f"--- {name}.log\n" + "\n".join(text))
        return "\n".join(parts)

    # -- internals ---------------------------------------------------------------------------

    def _program(self, name: str) -> str:
        path = find_program(name)
        if path is None:
            raise AssertionError(kube_skip_reason())
        return path

    def _make_pki(self) -> None:
        p = self.pki
        self.ca = Certs(p, "ca")
        self.front_proxy_ca = Certs(p, "front-proxy-ca")
        self.apiserver_cert = self.ca.issue(
            "apiserver", "kube-apiserver", server=True, client=False,
            dns=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local"], ips=["127.0.0.1", SERVICE_IP])
        self.kubelet_client_cert = self.ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                                                 ["system:masters"])
        self.front_proxy_client_cert = self.front_proxy_ca.issue("front-proxy-client", "front-proxy-client")
        sa_key = ec.generate_private_key(ec.SECP256R1())
        write(p / "sa.key", private_pem(sa_key))
        write(p / "sa.pub", sa_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                            serialization.PublicFormat.SubjectPublicKeyInfo))
        self.admin_cert = self.ca.issue("admin", "admin", ["system:masters"])
        self.scheduler_cert = self.ca.issue("scheduler", "system:kube-scheduler")
        self.controller_manager_cert = self.ca.issue("controller-manager", "system:kube-controller-manager")

    def _popen(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "wb")
        try:
            proc = subprocess.Popen([self._program(name), *args], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=self.workdir)
        finally:
            log.close()
        self.procs[name] = proc
        return proc

    def _wait_ok(self, name: str, url: str, context: ssl.SSLContext | None) -> None:
        proc = self.procs[name]

        def ok() -> bool:
            if proc.poll() is not None:
                raise ProcessDied(f"{name} exited with {proc.returncode}\n{self.logs()}")
            try:
                with urllib.request.urlopen(url, timeout=5, context=context) as resp:
                    return resp.status == 200
            except (urllib.error.URLError, OSError):
                return False

        t0 = time.monotonic()
        try:
            wait_until(ok, self.start_timeout, f"{name} at {url}", interval=0.1)
        except ProcessDied as err:
            raise AssertionError(str(err)) from None
        except TimeoutError as err:
            raise AssertionError(f"{err}\n{self.logs()}") from None
        self.start_seconds[name] = time.monotonic() - t0

    def _admin_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.load_cert_chain(*self.admin_cert)
        return context

    def _start_etcd(self) -> str:
        client, peer = free_port(), free_port()
        client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        self._popen("etcd", [
            "--name=test", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client_url}", f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=test={peer_url}", "--initial-cluster-state=new",
            "--unsafe-no-fsync",  # a test's data needs no durability; fsync is slow on a busy disk
            "--log-level=warn",
        ])
        self._wait_ok("etcd", f"{client_url}/health", None)
        return client_url

    def _start_apiserver(self, etcd_url: str) -> None:
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        p = self.pki
        self._popen("kube-apiserver", [
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={port}",
            f"--cert-dir={p}", f"--tls-cert-file={self.apiserver_cert[0]}", f"--tls-private-key-file={self.apiserver_cert[1]}",
            f"--client-ca-file={self.ca_file}",
            "--authorization-mode=Node,RBAC",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--service-account-key-file={p / 'sa.pub'}", f"--service-account-signing-key-file={p / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--kubelet-client-certificate={self.kubelet_client_cert[0]}",
            f"--kubelet-client-key={self.kubelet_client_cert[1]}",
            f"--kubelet-certificate-authority={self.ca_file}",
            f"--requestheader-client-ca-file={self.front_proxy_ca.cert_file}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={self.front_proxy_client_cert[0]}",
            f"--proxy-client-key-file={self.front_proxy_client_cert[1]}",
            # The kubernetes service's endpoints may not be a loopback address: keep none.
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true", "--profiling=false",
        ])
        self._wait_ok("kube-apiserver", f"{self.server}/readyz", self._admin_context())
        self.write_kubeconfig(self.kubeconfig, *self.admin_cert)

    def _component_args(self, name: str, cert: tuple[Path, Path]) -> list[str]:
        kubeconfig = self.write_kubeconfig(self.workdir / f"{name}.kubeconfig", *cert)
        return [f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}", f"--cert-dir={self.workdir / name}", "--leader-elect=false"]

    def _scheduler_args(self) -> list[str]:
        return self._component_args("kube-scheduler", self.scheduler_cert)

    def _controller_manager_args(self) -> list[str]:
        p = self.pki
        return [*self._component_args("kube-controller-manager", self.controller_manager_cert),
                f"--controllers={','.join(self.controllers)}",
                "--use-service-account-credentials=true",  # each controller with its own RBAC role
                f"--service-account-private-key-file={p / 'sa.key'}", f"--root-ca-file={self.ca_file}",
                f"--cluster-signing-cert-file={self.ca_file}", f"--cluster-signing-key-file={p / 'ca.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--node-monitor-grace-period={self.node_monitor_grace_period}"]

    def _start_components(self, components: dict[str, tuple[list[str], str]]) -> None:
        """Start each ``name: (args, health path)`` at once, then wait for each to answer ok."""
        urls = {}
        for name, (args, path) in components.items():
            port = next(a.split("=", 1)[1] for a in args if a.startswith("--secure-port="))
            self._popen(name, args)
            urls[name] = f"https://127.0.0.1:{port}{path}"
        # Each serves a self-signed cert from its --cert-dir; /healthz and /readyz need no credentials.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        for name, url in urls.items():
            self._wait_ok(name, url, context)
