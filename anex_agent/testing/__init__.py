"""What the demo, the tests and the benchmarks share to stand up a mesh without a cloud or a GPU.

- :mod:`.netlab`: network namespaces and veth links (root only), removed on close.
- :mod:`.mesh`: a whole mesh on one machine (coordinator, gateway, nodes in namespaces).
- :mod:`.services`: stand-ins for in-cluster services (HTTP, echo, DNS).
- :mod:`.probe_client`: a small HTTP client run inside a namespace, printing one JSON result.
- :mod:`.kube`: a real Kubernetes control plane on this machine (etcd, apiserver, scheduler).
- :mod:`.fake_providers`: fake Vast.AI and RunPod servers shaped from their published APIs.
- :mod:`.fake_nvml`: a fake ``pynvml`` module for machines without a GPU.

Product code imports this package only through the ``anex-agent demo`` command
(:mod:`anex_agent.demo`); the tests, the integration tests and the benchmarks import it freely.
"""
