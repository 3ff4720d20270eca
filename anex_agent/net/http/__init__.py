"""HTTP/1.1 over h11 and asyncio streams: the coordinator client's transport (:mod:`.client`) and the
small server of the agent API and the ``/metrics`` endpoints (:mod:`.server`)."""
