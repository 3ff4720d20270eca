"""The virtual node's settings: one line naming the flag or variable for a bad value."""

from __future__ import annotations

import argparse

import pytest

from anex_agent.errors import ConfigError
from anex_agent.virtualnode import settings

ENV = {"ANEX_COORDINATOR_URL": "http://coordinator:8700", "ANEX_ADMIN_TOKEN": "a" * 24,
       "ANEX_VIRTUAL_NODE_IP": "10.0.0.5"}


def parse(*argv: str, env=ENV) -> settings.Settings:
    parser = argparse.ArgumentParser()
    settings.configure(parser)
    return settings.from_args(parser.parse_args(list(argv)), env)


def test_defaults_and_environment():
    s = parse()
    assert s.providers == ("vastai", "runpod") and s.internal_ip == "10.0.0.5" and s.kubelet_port == 10250
    assert s.provision_prefix == "vk-" and s.kubeconfig is None and "a" * 24 not in repr(s)
    s = parse("--providers", "vastai", "--kubelet-port", "10251", "--internal-ip", "192.168.1.2",
              env={**ENV, "KUBECONFIG": "/k"})
    assert s.providers == ("vastai",) and s.kubelet_port == 10251 and s.internal_ip == "192.168.1.2"
    assert s.kubeconfig == "/k"
    assert s.metrics_listen is None and s.volume_refresh == 60
    assert parse("--volume-refresh", "2.5").volume_refresh == 2.5
    assert parse("--metrics-listen", ":9108").metrics_listen == ("127.0.0.1", 9108)
    assert parse(env={**ENV, "ANEX_VIRTUAL_NODE_METRICS_LISTEN": "0.0.0.0:9108"}).metrics_listen == ("0.0.0.0", 9108)


@pytest.mark.parametrize("argv, env, source", [
    ((), {k: v for k, v in ENV.items() if k != "ANEX_COORDINATOR_URL"}, "ANEX_COORDINATOR_URL"),
    ((), {k: v for k, v in ENV.items() if k != "ANEX_ADMIN_TOKEN"}, "ANEX_ADMIN_TOKEN"),
    (("--providers", "vastai,aws"), ENV, "--providers"),
    ((), {**ENV, "ANEX_VIRTUAL_NODE_PROVIDERS": "gcp"}, "ANEX_VIRTUAL_NODE_PROVIDERS"),
    (("--internal-ip", "not-an-ip"), ENV, "--internal-ip"),
    ((), {**ENV, "ANEX_VIRTUAL_NODE_IP": "999.1.1.1"}, "ANEX_VIRTUAL_NODE_IP"),
    (("--kubelet-port", "0"), ENV, "--kubelet-port"),
    (("--provision-prefix", "VK_"), ENV, "--provision-prefix"),
    (("--max-pods", "-1"), ENV, "--max-pods"),
    (("--poll-interval", "0"), ENV, "--poll-interval"),
    (("--volume-refresh", "soon"), ENV, "--volume-refresh"),
    (("--coordinator", "ftp://x"), ENV, "--coordinator"),
    (("--metrics-listen", "127.0.0.1:x"), ENV, "--metrics-listen"),
    ((), {**ENV, "ANEX_VIRTUAL_NODE_METRICS_LISTEN": "nowhere"}, "ANEX_VIRTUAL_NODE_METRICS_LISTEN"),
])
def test_a_bad_value_names_its_source(argv, env, source):
    with pytest.raises(ConfigError) as err:
        parse(*argv, env=env)
    assert str(err.value).startswith(source)


def test_the_command_says_what_is_wrong_in_one_line(tmp_path):
    import os
    import subprocess
    import sys

    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ANEX_")}, **ENV}
    out = subprocess.run([sys.executable, "-m", "anex_agent", "virtual-node", "--kubeconfig", str(tmp_path / "absent")],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"anex-agent virtual-node: --kubeconfig: {tmp_path / 'absent'}: no such file; expected a kubeconfig"]
    (tmp_path / "bad").write_text("{}")
    out = subprocess.run([sys.executable, "-m", "anex_agent", "virtual-node"], env={**env, "KUBECONFIG": str(
        tmp_path / "bad")}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.startswith(f"anex-agent virtual-node: KUBECONFIG: cannot load {tmp_path / 'bad'}: ")
