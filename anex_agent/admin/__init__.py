"""``anex-agent admin``: the operator's command for a coordinator's REST API (see :mod:`.cli`)."""
