"""The virtual node's kubelet API: the HTTPS port the API server proxies ``kubectl logs``,
``exec``, ``attach``, ``port-forward`` and ``top`` to (docs/kubernetes.md).

* :mod:`.context` -- what every concern module is given (the seam);
* :mod:`.server` -- the HTTPS application per Node, assembled from concern modules;
* :mod:`.auth` -- who may connect: client certificates, TokenReview, SubjectAccessReview,
  with the kubelet's path to subresource mapping (:mod:`.authmap`, pure);
* :mod:`.logs` -- ``/containerLogs``; :mod:`.stats` -- ``/stats/summary``, ``/metrics/resource``
  (shaped by :mod:`.statshape`, pure); :mod:`.podlist` -- ``/pods``, ``/healthz``;
* :mod:`.streams` -- exec, attach, port-forward (when present);
* :mod:`.certs` -- the serving certificate, from files or the cluster's CSR API.
"""
