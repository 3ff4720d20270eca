"""The wire models' former home: they live in modules by concern (:mod:`.base`, :mod:`.telemetry`,
:mod:`.heartbeat`, :mod:`.join`, :mod:`.nodes`, :mod:`.gateways`, :mod:`.watch`, :mod:`.problem`,
:mod:`.reader`); this module names them all until every caller imports from those modules.
"""

from __future__ import annotations

from anex_agent.wire.base import *  # noqa: F401,F403
from anex_agent.wire.gateways import *  # noqa: F401,F403
from anex_agent.wire.heartbeat import *  # noqa: F401,F403
from anex_agent.wire.join import *  # noqa: F401,F403
from anex_agent.wire.nodes import *  # noqa: F401,F403
from anex_agent.wire.problem import *  # noqa: F401,F403
from anex_agent.wire.reader import *  # noqa: F401,F403
from anex_agent.wire.telemetry import *  # noqa: F401,F403
from anex_agent.wire.telemetry import _telemetry_fine  # noqa: F401
from anex_agent.wire.watch import *  # noqa: F401,F403
