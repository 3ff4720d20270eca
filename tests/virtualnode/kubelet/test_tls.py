"""The kubelet port over TLS: client certificates of the client CA only, the serving
certificate swapped for new handshakes."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import ssl
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from anex_agent.virtualnode.kubelet import certs, server
from tests.virtualnode.kubelet import fakes


class Ca:
    def __init__(self, folder: Path, name: str) -> None:
        self.folder = folder
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.file = folder / f"{name}.crt"
        self.file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, cn: str, orgs=(), *, server_ip: str | None = None) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([*(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs),
                             x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(self.cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(hours=1)))
        if server_ip:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(server_ip))]),
                                            critical=False).add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        else:
            builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_file, key_file = self.folder / f"{name}.crt", self.folder / f"{name}.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return cert_file, key_file


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def tls_kubelet(tmp_path):
    cluster, other = Ca(tmp_path, "cluster-ca"), Ca(tmp_path, "other-ca")
    serving = cluster.issue("serving", "system:node:anex-vastai", ["system:nodes"], server_ip="127.0.0.1")
    tls = server.tls_context(str(serving[0]), str(serving[1]), str(cluster.file))
    context = fakes.context(fakes.FakeCoordinator(), [])
    context.authorizer.reviews.allowed.add(("kube-apiserver-kubelet-client", "healthz"))
    port = free_port()
    started = asyncio.Event()
    task = asyncio.create_task(server.serve(context, "127.0.0.1", port, tls, started), name="kubelet-test")
    await asyncio.wait_for(started.wait(), 30)
    try:
        yield f"https://127.0.0.1:{port}", cluster, other, tls
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def client_context(ca: Ca, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca.file))
    if cert:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    return ctx


async def get(url: str, ctx: ssl.SSLContext) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url, ssl=ctx) as answer:
        return answer.status, await answer.text()


async def test_the_api_servers_client_certificate_is_let_in(tls_kubelet):
    url, cluster, _other, _ = tls_kubelet
    cert = cluster.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ["kubeadm:cluster-admins"])
    assert await get(f"{url}/healthz", client_context(cluster, cert)) == (200, "ok")


async def test_no_certificate_is_401_and_a_certificate_of_another_ca_fails_the_handshake(tls_kubelet):
    url, cluster, other, _ = tls_kubelet
    assert await get(f"{url}/healthz", client_context(cluster)) == (401, "Unauthorized")
    stranger = other.issue("stranger", "kube-apiserver-kubelet-client")
    with pytest.raises(aiohttp.ClientError):
        await get(f"{url}/healthz", client_context(cluster, stranger))


async def test_a_certificate_of_the_cluster_ca_without_the_rbac_verb_is_403(tls_kubelet):
    url, cluster, _other, _ = tls_kubelet
    cert = cluster.issue("dev", "dev", ["developers"])
    status, text = await get(f"{url}/pods", client_context(cluster, cert))
    assert status == 403 and "user=dev, verb=get, resource=nodes, subresource(s)=[pods proxy]" in text


async def test_a_renewed_serving_certificate_serves_new_handshakes(tls_kubelet):
    url, cluster, _other, tls = tls_kubelet
    renewed = cluster.issue("serving-2", "system:node:anex-vastai", ["system:nodes", "renewed"], server_ip="127.0.0.1")
    tls.load_cert_chain(str(renewed[0]), str(renewed[1]))
    reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]),
                                                   ssl=client_context(cluster), server_hostname="127.0.0.1")
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        orgs = x509.load_der_x509_certificate(der).subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
        assert [o.value for o in orgs] == ["system:nodes", "renewed"]
    finally:
        writer.close()


def test_renewal_comes_at_eighty_percent_of_the_life():
    assert certs.renew_at(1000.0, 2000.0) == 1800.0


def test_the_request_asks_for_the_nodes_name_group_and_address():
    csr_pem, key_pem = certs.make_request("anex-vastai", "192.0.2.10")
    csr = x509.load_pem_x509_csr(csr_pem)
    assert csr.subject.rfc4514_string() == "CN=system:node:anex-vastai,O=system:nodes"
    sans = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("192.0.2.10")]
    assert sans.get_values_for_type(x509.DNSName) == ["anex-vastai"]
    assert b"PRIVATE KEY" in key_pem


class _Renewed(Exception):
    pass


async def test_the_csr_certificate_is_asked_again_at_eighty_percent_and_swapped_in(tmp_path):
    from types import SimpleNamespace

    from anex_agent.virtualnode.kubelet.runner import NodeListener
    from anex_agent.virtualnode.kubelet.settings import KubeletSettings

    cluster = Ca(tmp_path, "cluster-ca")
    first = cluster.issue("first", "system:node:anex-vastai", ["system:nodes", "first"], server_ip="127.0.0.1")
    second = cluster.issue("second", "system:node:anex-vastai", ["system:nodes", "second"], server_ip="127.0.0.1")
    answers = [certs.Issued(first[0], first[1], 1000.0, 2000.0), certs.Issued(second[0], second[1], 1800.0, 2800.0)]
    waits = []

    class Issuer:
        async def issue(self):
            return answers.pop(0)

    listener = NodeListener(SimpleNamespace(internal_ip="127.0.0.1"), KubeletSettings(client_ca=cluster.file),
                            fakes.context(fakes.FakeCoordinator(), []), 0, kube=None)
    listener.issuer = Issuer
    listener.clock = lambda: 1100.0

    async def sleep(seconds):
        waits.append(seconds)
        if len(waits) == 1:
            assert listener.ready.is_set()
            return
        raise _Renewed

    listener.sleep = sleep
    before = listener.tls
    with pytest.raises(_Renewed):
        await listener.keep_certificate()
    assert before is None and waits == [700.0, 1500.0]  # 80 % of each life, from the clock
    der = None
    port = free_port()
    started = asyncio.Event()
    task = asyncio.create_task(server.serve(listener.context, "127.0.0.1", port, listener.tls, started), name="t")
    try:
        await asyncio.wait_for(started.wait(), 30)
        _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context(cluster),
                                                        server_hostname="127.0.0.1")
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    orgs = x509.load_der_x509_certificate(der).subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    assert [o.value for o in orgs] == ["system:nodes", "second"]


async def test_a_followed_log_whose_client_went_away_stops_reading_and_frees_its_slot(tmp_path):
    cluster = Ca(tmp_path, "cluster-ca")
    serving = cluster.issue("serving", "system:node:anex-vastai", ["system:nodes"], server_ip="127.0.0.1")
    tls = server.tls_context(str(serving[0]), str(serving[1]), str(cluster.file))
    coordinator = fakes.FakeCoordinator()
    coordinator.views = [fakes.view("u1")]
    context = fakes.context(coordinator, [fakes.pod("train", "u1")])
    port = free_port()
    started = asyncio.Event()
    task = asyncio.create_task(server.serve(context, "127.0.0.1", port, tls, started), name="kubelet-test")
    await asyncio.wait_for(started.wait(), 30)
    try:
        coordinator.log_chunks.put_nowait(b"first\n")  # then nothing: a quiet pod
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context(cluster))
        writer.write(b"GET /containerLogs/ml/train/training?follow=true HTTP/1.1\r\nHost: kubelet\r\n"
                     b"Authorization: Bearer admin-token\r\n\r\n")
        answer = b""
        while b"first" not in answer:
            answer += await asyncio.wait_for(reader.read(4096), 30)
        assert context.slots.open == 1
        writer.transport.abort()  # the client goes away while the pod writes nothing
        await asyncio.wait_for(coordinator.log_closed.wait(), 30)  # the coordinator's stream closed
        assert context.slots.open == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
