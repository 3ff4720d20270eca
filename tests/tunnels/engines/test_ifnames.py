"""Names of the interfaces we create: ours by prefix, short enough for Linux, bad ones refused."""

from __future__ import annotations

import pytest

from anex_agent.errors import ConfigError
from anex_agent.tunnels.engines import ifnames


def test_new_ifname_is_ours_and_short():
    names = {ifnames.new_ifname("node") for _ in range(50)}
    assert len(names) == 50
    assert all(n.startswith("anxnod") and len(n) <= ifnames.IFNAME_MAX for n in names)


@pytest.mark.parametrize("name", ["", "x" * 16, "a/b", "a b"])
def test_bad_ifnames(name):
    with pytest.raises(ConfigError, match="interface"):
        ifnames.check_ifname(name)
