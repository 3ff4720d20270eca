"""The provisioning routes' wire models, as the coordinator's modules name them.

They live in :mod:`anex_agent.wire.provisioning`, shared with the clients of the routes (the
coordinator client and the virtual node, which must not import the coordinator)."""

from anex_agent.wire.provisioning import (  # noqa: F401
    ARG_MAX, ARGS_MAX, ENV_MAX, ENV_VALUE_MAX, IMAGE_MAX, LIVE_STATES, NAME_PATTERN, WORK_STATES, AttemptView,
    ProvisionCreate, ProvisionEvent, ProvisionList, ProvisionState, ProvisionView,
)
