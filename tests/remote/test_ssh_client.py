"""``anex-agent ssh -L``: the forward spec is read with the one HOST:PORT parser."""

from __future__ import annotations

import pytest

from anex_agent.errors import ConfigError
from anex_agent.remote.ssh_client import _forward_spec


def test_forward_spec_reads_local_port_host_and_port():
    assert _forward_spec("8080:localhost:80") == (8080, "localhost", 80)
    assert _forward_spec("5432:[::1]:5432") == (5432, "::1", 5432)


@pytest.mark.parametrize("spec", ["8080", "8080:localhost", "0:localhost:80", "8080:localhost:²", "x:localhost:80",
                                  "8080:localhost:70000"])
def test_a_bad_forward_spec_names_the_option(spec):
    with pytest.raises(ConfigError) as err:
        _forward_spec(spec)
    assert "-L" in str(err.value) and "LOCAL_PORT:HOST:PORT" in str(err.value)
