"""The kubelet's path -> nodes/<subresource> and method -> verb mapping."""

import pytest

from anex_agent.virtualnode.kubelet import authmap


@pytest.mark.parametrize("path, subs", [
    ("/stats/summary", ("stats",)),
    ("/stats", ("stats",)),
    ("/metrics", ("metrics",)),
    ("/metrics/resource", ("metrics",)),
    ("/metrics/cadvisor", ("metrics",)),
    ("/logs/", ("log",)),
    ("/logs/messages", ("log",)),
    ("/containerLogs/ns/pod/c", ("proxy",)),
    ("/exec/ns/pod/c", ("proxy",)),
    ("/attach/ns/pod/c", ("proxy",)),
    ("/portForward/ns/pod", ("proxy",)),
    ("/run/ns/pod/c", ("proxy",)),
    ("/pods", ("pods", "proxy")),
    ("/pods/", ("pods", "proxy")),
    ("/healthz", ("healthz", "proxy")),
    ("/runningpods/", ("pods", "proxy")),
    ("/statsx", ("proxy",)),  # not below /stats
    ("/podsx", ("proxy",)),
    ("/", ("proxy",)),
])
def test_paths_map_to_the_kubelets_subresources(path, subs):
    assert authmap.subresources(path) == subs


@pytest.mark.parametrize("method, verb", [("GET", "get"), ("POST", "create"), ("PUT", "update"),
                                          ("PATCH", "patch"), ("DELETE", "delete"), ("OPTIONS", "")])
def test_the_verb_follows_the_method(method, verb):
    (attrs,) = authmap.attributes(method, "/exec/ns/p/c", "anex-vastai")
    assert attrs == authmap.Attributes(verb, "proxy", "anex-vastai")


def test_pods_asks_pods_before_proxy_for_the_named_node():
    assert authmap.attributes("GET", "/pods", "n1") == (authmap.Attributes("get", "pods", "n1"),
                                                        authmap.Attributes("get", "proxy", "n1"))
