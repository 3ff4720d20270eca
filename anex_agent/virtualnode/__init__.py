"""The virtual node: Kubernetes Nodes whose pods run on machines the coordinator rents.

One Node per provider the coordinator rents from; each pod bound to one becomes one provision
(keyed on the pod's uid), and its status, Events and deletion follow the provision as a
kubelet's follow a container. Modules, by concern:

* :mod:`.settings` -- flags and environment, parsed once; :mod:`.cli` -- the role's entry point;
* :mod:`.kube` -- the Kubernetes API (kubernetes_asyncio underneath, plain dicts on top);
* :mod:`.nodeobject` (pure) and :mod:`.nodes` -- Nodes, Leases, node status and capacity;
* :mod:`.podspec` (pure) -- a pod to a ``ProvisionCreate``, or a refusal naming the field;
* :mod:`.podstatus` (pure) -- a provision and its workload state to the pod's status;
* :mod:`.pods` and :mod:`.workqueue` -- the controller that keeps pods and provisions in step;
* :mod:`.events` -- Events about pods; :mod:`.metrics` -- its Prometheus metrics (``--metrics-listen``).

It imports no other role: the coordinator is reached through :mod:`anex_agent.client.rest` and the
shared wire models (:mod:`~anex_agent.wire.provisioning`, :mod:`~anex_agent.wire.pod`,
:mod:`~anex_agent.wire.heartbeat`).
"""
