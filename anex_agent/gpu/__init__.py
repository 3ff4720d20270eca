"""GPU telemetry through NVML (nvidia-ml-py), host telemetry through psutil, health and qualification.

Entry points: :class:`anex_agent.gpu.monitor.TelemetryMonitor` (the agent owns one),
:func:`anex_agent.gpu.exposition.register_collectors` (its ``/metrics``),
:func:`anex_agent.gpu.telemetry.build_telemetry` (the heartbeat block, shape documented there
and in docs/telemetry.md), :func:`anex_agent.gpu.qualify.qualify` (on-prem rules). Nothing here
imports ``pynvml`` at import time.
"""
