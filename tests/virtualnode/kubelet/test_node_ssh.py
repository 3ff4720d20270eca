"""The way to a pod's machine: a certificate from the coordinator for that node, only the features
asked for, and failures as one line naming the node."""

from __future__ import annotations

import pytest

from anex_agent.errors import ConfigError, CoordinatorError
from anex_agent.virtualnode.kubelet.context import PodTarget
from anex_agent.virtualnode.kubelet.streams import node_ssh

TARGET = PodTarget(namespace="ml", name="train", uid="u1", node_name="anex-vastai", provision_id="p-u1",
                   node_id="n-0123456789ab", address="100.64.0.7", ssh_port=2222, api_port=9555,
                   containers=("training",))


class Coordinator:
    def __init__(self, fail: Exception | None = None, port: int = 2222):
        self.requests = []
        self.fail = fail
        self.port = port

    async def get_node(self, node_id):
        from types import SimpleNamespace
        return SimpleNamespace(id=node_id)

    async def create_ssh_certificate(self, node_id, request):
        self.requests.append((node_id, request))
        if self.fail:
            raise self.fail
        raise RuntimeError("stop here: the certificate request is what this test looks at")


async def test_the_certificate_is_asked_for_that_node_with_only_the_features_given():
    coordinator = Coordinator()
    with pytest.raises(RuntimeError, match="stop here"):
        await node_ssh.connect(coordinator, TARGET, requested_for="kubectl exec ml/train by x via anex-vastai",
                               timeout=5, features=["pty"])
    ((node_id, request),) = coordinator.requests
    assert node_id == "n-0123456789ab"
    assert request.features == ["pty"] and request.validity == node_ssh.CERT_VALIDITY
    assert request.requested_for == "kubectl exec ml/train by x via anex-vastai"
    assert "PRIVATE" not in request.public_key  # only the public half leaves


@pytest.mark.parametrize("failure, said", [
    (CoordinatorError("POST /v1/nodes/n-0123456789ab/ssh-certificates: 409 no SSH server", status=409,
                      retryable=False), "409 no SSH server"),
    (ConfigError("NODE", "no node 'n-0123456789ab'; see GET /v1/nodes"), "no node"),
])
async def test_a_refused_certificate_is_one_line_naming_the_node(failure, said):
    coordinator = Coordinator(failure)
    with pytest.raises(node_ssh.NodeUnreachable) as err:
        await node_ssh.connect(coordinator, TARGET, requested_for="x", timeout=5, features=[])
    assert str(err.value).startswith('node n-0123456789ab of pod "ml/train": no SSH certificate from the coordinator')
    assert said in str(err.value)
