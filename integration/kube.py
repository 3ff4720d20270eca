"""The real Kubernetes control plane of :mod:`anex_agent.testing.kube`, for integration tests.

API::

    from integration.kube import ControlPlane, kube_skip_reason, require_kube

Everything but :func:`require_kube` is :mod:`anex_agent.testing.kube`'s (one implementation,
which the demo runs too); :func:`require_kube` is the ``pytest.mark.skipif`` marker that skips
with :func:`kube_skip_reason` when a control-plane program is missing.
"""

from __future__ import annotations

from typing import Any

from anex_agent.testing.kube import (  # noqa: F401  (re-exported for the tests)
    DEFAULT_CONTROLLERS,
    NODE_MONITOR_GRACE_PERIOD,
    PROGRAMS,
    SERVICE_CIDR,
    SERVICE_IP,
    START_TIMEOUT,
    TOOLS_BIN_DIR,
    Certs,
    ControlPlane,
    find_program,
    free_port,
    kube_skip_reason,
    private_pem,
    write,
)


def require_kube() -> Any:
    """A pytest skip marker: skip with the reason when a control-plane program is missing."""
    import pytest

    reason = kube_skip_reason()
    return pytest.mark.skipif(reason is not None, reason=reason or "")
