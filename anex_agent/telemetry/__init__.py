"""Telemetry a node reports: the heartbeat's wire models, their bounds, and their Prometheus rendering.

- :mod:`.models`: the ``telemetry`` block of a heartbeat (pure pydantic models, the XID vocabulary).
- :mod:`.bounds`: the size limits checked before a block is parsed.
- :mod:`.exposition`: dcgm-exporter compatible rendering, shared by the agent and the coordinator.
- :mod:`.options`: how GPU metrics are named, parsed once at each role's edge.

Shared by every role; imports no role.
"""
