"""KubeApi over kubernetes_asyncio against a small fake API server (aiohttp): plain dicts back,
404 as None, the patch content types, a watch's lines as events, 410 and 403 as KubeError, a
403 logged once naming the verb and resource."""

from __future__ import annotations

import json
import logging

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from anex_agent.errors import KubeError
from anex_agent.virtualnode.kube import KubeApi

POD = {"metadata": {"name": "p", "namespace": "default", "uid": "u1", "resourceVersion": "7"},
       "spec": {"nodeName": "anex-vastai"}}


def status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response({"kind": "Status", "status": "Failure", "code": code, "reason": reason,
                              "message": message}, status=code)


@pytest.fixture
async def api():
    seen: list[tuple[str, str, str]] = []

    async def node(request):
        if request.match_info["name"] == "absent":
            return status(404, "NotFound", 'nodes "absent" not found')
        return web.json_response({"metadata": {"name": request.match_info["name"]}})

    async def node_status(request):
        seen.append((request.method, request.path, request.content_type))
        return web.json_response(await request.json())

    async def pod_status(request):
        return status(403, "Forbidden", 'pods "p" is forbidden: cannot patch resource "pods/status"')

    async def pods(request):
        seen.append(("GET", request.path, request.query_string))
        if request.query.get("watch", "").lower() != "true":  # the client writes True; Go's ParseBool takes it
            return web.json_response({"metadata": {"resourceVersion": "10"}, "items": [POD]})
        if request.query.get("resourceVersion") == "1":
            return web.json_response({"type": "ERROR", "object": {"kind": "Status", "code": 410,
                                                                  "reason": "Expired", "message": "too old"}})
        response = web.StreamResponse()
        await response.prepare(request)
        for kind in ("ADDED", "BOOKMARK", "MODIFIED", "DELETED"):
            await response.write(json.dumps({"type": kind, "object": POD}).encode() + b"\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/api/v1/nodes/{name}", node)
    app.router.add_patch("/api/v1/nodes/{name}/status", node_status)
    app.router.add_patch("/api/v1/namespaces/{ns}/pods/{name}/status", pod_status)
    app.router.add_get("/api/v1/pods", pods)
    server = TestServer(app)
    await server.start_server()
    from kubernetes_asyncio import client

    configuration = client.Configuration(host=str(server.make_url("")).rstrip("/"))
    kube = KubeApi(client.ApiClient(configuration))
    try:
        yield kube, seen
    finally:
        await kube.close()
        await server.close()


async def test_plain_dicts_404_as_none_and_merge_patches(api):
    kube, seen = api
    assert await kube.get_node("anex-vastai") == {"metadata": {"name": "anex-vastai"}}
    assert await kube.get_node("absent") is None
    written = await kube.patch_node_status("anex-vastai", {"capacity": {"pods": "100"}})
    assert written == {"status": {"capacity": {"pods": "100"}}}
    assert seen[-1] == ("PATCH", "/api/v1/nodes/anex-vastai/status", "application/merge-patch+json")


async def test_list_and_watch_pods(api):
    kube, seen = api
    listed = await kube.list_pods("spec.nodeName=anex-vastai")
    assert listed["items"] == [POD] and listed["metadata"]["resourceVersion"] == "10"
    events = [(kind, obj["metadata"]["uid"]) async for kind, obj in kube.watch_pods("spec.nodeName=anex-vastai", "10")]
    assert events == [("ADDED", "u1"), ("MODIFIED", "u1"), ("DELETED", "u1")]  # the bookmark left out
    assert "fieldSelector=spec.nodeName%3Danex-vastai" in seen[-1][2] and "resourceVersion=10" in seen[-1][2]
    with pytest.raises(KubeError) as expired:
        async for _ in kube.watch_pods("spec.nodeName=anex-vastai", "1"):
            pass
    assert expired.value.status == 410 and expired.value.reason == "Expired"


async def test_a_403_names_the_verb_and_resource_once(api, caplog):
    kube, _ = api
    with caplog.at_level(logging.ERROR):
        for _ in range(2):
            with pytest.raises(KubeError) as refused:
                await kube.patch_pod_status("default", "p", {"phase": "Running"})
            assert refused.value.forbidden and not refused.value.retryable
    lines = [r.message for r in caplog.records if "forbidden" in r.message]
    assert lines == ["forbidden: the virtual node's service account may not patch pods/status; grant it in the "
                     "ClusterRole (deploy/rbac.yaml)"]


async def test_no_answer_is_a_retryable_kube_error():
    from kubernetes_asyncio import client

    kube = KubeApi(client.ApiClient(client.Configuration(host="http://127.0.0.1:9")))
    try:
        with pytest.raises(KubeError) as err:
            await kube.get_node("anex-vastai")
        assert err.value.retryable and err.value.status is None
    finally:
        await kube.close()


async def test_connect_reads_a_kubeconfig_and_names_what_is_wrong(tmp_path, monkeypatch):
    from anex_agent.errors import ConfigError
    from anex_agent.virtualnode.kube import connect

    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    api_client = await connect(str(path))
    try:
        assert api_client.configuration.host == "https://127.0.0.1:6443"
    finally:
        await api_client.close()
    with pytest.raises(ConfigError) as missing:
        await connect(str(tmp_path / "absent"), "KUBECONFIG")
    assert str(missing.value).startswith("KUBECONFIG: ") and "no such file" in str(missing.value)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError) as outside:
        await connect(None)
    assert str(outside.value).startswith("KUBECONFIG") and "--kubeconfig" in str(outside.value)
