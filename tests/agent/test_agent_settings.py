"""Agent settings: flags + environment parsed once, every bad value a ConfigError naming its source."""

import argparse
import socket
from pathlib import Path

import pytest

from anex_agent.agent import settings as s
from anex_agent.errors import ConfigError
from anex_agent.wire.base import Provider

BASE = {"ANEX_COORDINATOR_URL": "http://10.0.0.1:8080", "ANEX_JOIN_TOKEN": "tok"}


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def free_listens():
    return {"ANEX_PROXY_LISTEN": f"127.0.0.1:{free_port()}", "ANEX_API_LISTEN": f"127.0.0.1:{free_port()}"}


def parse(env, argv=()):
    parser = argparse.ArgumentParser()
    s.add_arguments(parser)
    return s.from_args(parser.parse_args(list(argv)), env)


def test_defaults():
    cfg = parse({**BASE, "ANEX_STATE_DIR": "/tmp/x"})
    assert cfg.coordinator_url == "http://10.0.0.1:8080"
    assert cfg.join_token == "tok"
    assert cfg.state_dir == Path("/tmp/x")
    assert cfg.engine == "auto" and cfg.path == "auto"
    assert str(cfg.proxy_listen) == "127.0.0.1:3128"
    assert str(cfg.api_listen) == "127.0.0.1:9555"
    assert cfg.provider is Provider.other
    assert cfg.tunnels == ()


def test_flags_override_environment():
    cfg = parse({**BASE, "ANEX_ENGINE": "kernel"}, ["--engine", "wireguard-go", "--proxy-listen", "127.0.0.1:4000"])
    assert cfg.engine == "wireguard-go"
    assert cfg.proxy_listen == s.ListenAddress("127.0.0.1", 4000)


def test_default_state_dir_root_and_user():
    assert s.default_state_dir({}, euid=0) == Path("/var/lib/anex-agent")
    assert s.default_state_dir({"HOME": "/home/u"}, euid=1000) == Path("/home/u/.local/state/anex-agent")
    assert s.default_state_dir({"XDG_STATE_HOME": "/xs"}, euid=1000) == Path("/xs/anex-agent")


def test_tunnels_from_environment_sorted():
    cfg = parse({**BASE, "GW_TUNNEL_6000": "db.default.svc.cluster.local:5432", "GW_TUNNEL_5000": "10.96.0.10:80"})
    assert [(t.source, t.spec.listen_port, t.spec.target) for t in cfg.tunnels] == [
        ("GW_TUNNEL_5000", 5000, "10.96.0.10:80"),
        ("GW_TUNNEL_6000", 6000, "db.default.svc.cluster.local:5432"),
    ]


def test_ipv6_tunnel_target():
    (t,) = s.parse_tunnels({"GW_TUNNEL_7000": "[fd00::1]:80"})
    assert t.spec.target == "[fd00::1]:80"


@pytest.mark.parametrize(
    "name,value,needle",
    [
        ("GW_TUNNEL_0", "a:1", "not a port from 1 to 65535"),
        ("GW_TUNNEL_65536", "a:1", "not a port from 1 to 65535"),
        ("GW_TUNNEL_abc", "a:1", "not a port from 1 to 65535"),
        ("GW_TUNNEL_", "a:1", "not a port from 1 to 65535"),
        ("GW_TUNNEL_5000", "nohostport", "is not <host>:<port>"),
        ("GW_TUNNEL_5000", "host:", "is not <host>:<port>"),
        ("GW_TUNNEL_5000", ":80", "is not <host>:<port>"),
        ("GW_TUNNEL_5000", "host:0", "is not <host>:<port>"),
        ("GW_TUNNEL_5000", "host:99999", "is not <host>:<port>"),
        ("GW_TUNNEL_5000", "ho st:80", "is not <host>:<port>"),
    ],
)
def test_bad_tunnel_names_the_variable_and_what_is_accepted(name, value, needle):
    with pytest.raises(ConfigError) as info:
        parse({**BASE, name: value})
    assert info.value.source == name
    assert needle in str(info.value)
    assert "GW_TUNNEL_<port>=<host>:<port>" in str(info.value)


def test_tunnel_flag_and_variable_for_the_same_port():
    with pytest.raises(ConfigError) as info:
        parse({**BASE, "GW_TUNNEL_5000": "a:1"}, ["--tunnel", "5000=b:2"])
    assert info.value.source == "--tunnel"
    assert "GW_TUNNEL_5000" in str(info.value)


def test_tunnel_port_in_use_names_the_variable():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = parse({**BASE, f"GW_TUNNEL_{port}": "svc:80", **free_listens()})
        with pytest.raises(ConfigError) as info:
            s.check_ports_free(cfg)
    assert info.value.source == f"GW_TUNNEL_{port}"
    assert "already in use" in str(info.value)


def test_tunnel_port_same_as_proxy():
    cfg = parse({**BASE, "GW_TUNNEL_3128": "svc:80"})
    with pytest.raises(ConfigError) as info:
        s.check_ports_free(cfg)
    assert info.value.source == "GW_TUNNEL_3128"
    assert "ANEX_PROXY_LISTEN" in str(info.value)


def test_free_ports_pass():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cfg = parse({**BASE, f"GW_TUNNEL_{port}": "svc:80", **free_listens()})
    s.check_ports_free(cfg)


@pytest.mark.parametrize(
    "env,source",
    [
        ({"ANEX_ENGINE": "nope"}, "ANEX_ENGINE"),
        ({"ANEX_PATH": "tcp"}, "ANEX_PATH"),
        ({"ANEX_PROXY_LISTEN": "3128"}, "ANEX_PROXY_LISTEN"),
        ({"ANEX_PROXY_LISTEN": "example.com:3128"}, "ANEX_PROXY_LISTEN"),
        ({"ANEX_API_LISTEN": "127.0.0.1:70000"}, "ANEX_API_LISTEN"),
        ({"ANEX_PROVIDER": "aws"}, "ANEX_PROVIDER"),
        ({"ANEX_COORDINATOR_URL": "ftp://x"}, "ANEX_COORDINATOR_URL"),
    ],
)
def test_bad_values_name_their_variable(env, source):
    with pytest.raises(ConfigError) as info:
        parse({**BASE, **env})
    assert info.value.source == source


def test_missing_coordinator():
    with pytest.raises(ConfigError) as info:
        parse({})
    assert info.value.source == "ANEX_COORDINATOR_URL"


def test_localhost_listen_is_loopback():
    assert s.parse_listen("localhost:3128", "X") == s.ListenAddress("127.0.0.1", 3128)
    assert s.parse_listen("[::1]:3128", "X") == s.ListenAddress("::1", 3128)


@pytest.mark.parametrize(
    "value, expected",
    [("127.0.0.1:3128", ("127.0.0.1", 3128)), ("[::1]:3128", ("::1", 3128)), (" 0.0.0.0:3128 ", ("0.0.0.0", 3128)),
     ("localhost:3129", ("127.0.0.1", 3129))],
)
def test_parse_listen(value, expected):
    assert s.parse_listen(value, "ANEX_PROXY_LISTEN") == s.ListenAddress(*expected)


@pytest.mark.parametrize("value", ["3128", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", "host.example:3128", "",
                                   ":8080", "::1:3128", "[127.0.0.1]:3128", "127.0.0.1:31²", "127.0.0.1:٣١٢٨",
                                   "127.0.0.1:３１２８", "127.0.0.1:①"])
def test_parse_listen_rejects_with_a_message_naming_the_variable(value):
    with pytest.raises(ConfigError) as info:
        s.parse_listen(value, "ANEX_PROXY_LISTEN")
    assert str(info.value).startswith(f"ANEX_PROXY_LISTEN: {value.strip()!r} must be HOST:PORT")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("source, value", [
    ("GW_TUNNEL_²", "db:5432"), ("GW_TUNNEL_٣", "db:5432"), ("GW_TUNNEL_３", "db:5432"),
    ("GW_TUNNEL_5432", "db:５４３２"), ("GW_TUNNEL_5432", "db:①"), ("GW_TUNNEL_5432", "fd00::1:5432"),
    ("GW_TUNNEL_5432", "d b:5432"),
])
def test_tunnel_ports_take_ascii_digits_and_ipv6_in_brackets(source, value):
    with pytest.raises(ConfigError) as info:
        parse({**BASE, source: value})
    assert info.value.source == source


@pytest.mark.parametrize("value", ["²", "٣", "３", "①", "0", "65536", "80,²"])
def test_inbound_ports_take_ascii_digits(value):
    with pytest.raises(ConfigError) as info:
        parse({**BASE, "ANEX_INBOUND_PORTS": value})
    assert info.value.source == "ANEX_INBOUND_PORTS" and "is not a port" in str(info.value)


def test_proxy_auth_optional_and_secret():
    assert parse(BASE).proxy_auth is None
    cfg = parse({**BASE, "ANEX_PROXY_AUTH": "user:s3cret"})
    assert cfg.proxy_auth.username == "user" and cfg.proxy_auth.password == "s3cret"
    assert "s3cret" not in repr(cfg)
    with pytest.raises(ConfigError) as info:
        parse({**BASE, "ANEX_PROXY_AUTH": "nocolon"})
    assert info.value.source == "ANEX_PROXY_AUTH"


def test_userspace_engine_is_accepted_now_that_it_has_a_stack():
    assert parse({**BASE, "ANEX_ENGINE": "userspace"}).engine == "userspace"
    assert parse(BASE, ["--engine", "userspace"]).engine == "userspace"


def test_engine_source_is_remembered():
    assert parse({**BASE, "ANEX_ENGINE": "wireguard-go"}).engine_source == "ANEX_ENGINE"
    assert parse(BASE, ["--engine", "kernel"]).engine_source == "--engine"


def test_inbound_ports():
    assert parse(BASE).inbound_ports == () and parse(BASE).inbound_udp_ports == ()
    assert parse({**BASE, "ANEX_INBOUND_PORTS": " 8888, 8000,8888 ,"}).inbound_ports == (8000, 8888)
    assert parse({**BASE, "ANEX_INBOUND_PORTS": "1"}, ["--inbound-ports", "22,80"]).inbound_ports == (22, 80)


def test_inbound_ports_take_a_protocol_a_bare_port_is_tcp():
    settings = parse({**BASE, "ANEX_INBOUND_PORTS": "8000, 5353/udp,9000/tcp,53/UDP,5353/udp,8000/tcp"})
    assert settings.inbound_ports == (8000, 9000)
    assert settings.inbound_udp_ports == (53, 5353)
    both = parse(BASE, ["--inbound-ports", "7000/tcp,7000/udp"])
    assert both.inbound_ports == (7000,) and both.inbound_udp_ports == (7000,)


@pytest.mark.parametrize("value", ["0", "65536", "80;81", "http", "-1", "8000-8001", "53/sctp", "53/", "/udp",
                                   "53/udp/tcp", "0/udp", "65536/udp", "５３/udp", "53 /udp"])
def test_bad_inbound_ports_name_the_variable(value):
    with pytest.raises(ConfigError) as err:
        parse({**BASE, "ANEX_INBOUND_PORTS": value})
    assert err.value.source == "ANEX_INBOUND_PORTS"
    assert "each PORT or PORT/tcp (TCP) or PORT/udp (UDP)" in str(err.value)


def test_bad_inbound_ports_flag_is_named():
    with pytest.raises(ConfigError) as err:
        parse(BASE, ["--inbound-ports", "8000,53/icmp"])
    assert err.value.source == "--inbound-ports" and "'53/icmp' in '8000,53/icmp' has the protocol 'icmp'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        parse(BASE, ["--inbound-ports", "70000/udp"])
    assert "'70000/udp' in '70000/udp' is not a port" in str(err.value)


@pytest.mark.parametrize("port", [9555, 3128, 2222])
def test_inbound_udp_ports_may_share_a_number_with_the_agents_tcp_listeners(port):
    """The agent API, the proxies and the SSH server listen on TCP only: the same number in UDP is
    the workload's port."""
    assert parse({**BASE, "ANEX_INBOUND_PORTS": f"{port}/udp"}).inbound_udp_ports == (port,)
    with pytest.raises(ConfigError):
        parse({**BASE, "ANEX_INBOUND_PORTS": f"{port}/tcp"})


@pytest.mark.parametrize("extra, port", [({}, 9555), ({}, 3128), ({"ANEX_API_LISTEN": "127.0.0.1:9600"}, 9600)])
def test_inbound_ports_never_include_the_api_or_proxy_port(extra, port):
    """wireproxy forwards inbound ports from 127.0.0.1: the API would take mesh callers for local ones."""
    with pytest.raises(ConfigError) as err:
        parse({**BASE, **extra, "ANEX_INBOUND_PORTS": f"8000,{port}"})
    assert err.value.source == "ANEX_INBOUND_PORTS"
    assert f"port {port} is" in str(err.value)


def test_inbound_ports_never_include_the_ssh_servers_port():
    """The SSH server serves the mesh on its own port: an inbound port there would listen twice."""
    with pytest.raises(ConfigError) as err:
        parse({**BASE, "ANEX_INBOUND_PORTS": "8000,2222"})
    assert err.value.source == "ANEX_INBOUND_PORTS" and "SSH server" in str(err.value)
    with pytest.raises(ConfigError):
        parse({**BASE, "ANEX_INBOUND_PORTS": "8000", "ANEX_SSH_PORT": "8000"})
    assert parse({**BASE, "ANEX_INBOUND_PORTS": "2222", "ANEX_SSH_PORT": "0"}).inbound_ports == (2222,)


def test_cli_userspace_engine_is_taken_and_goes_on_to_the_join(tmp_path):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANEX_", "GW_TUNNEL_"))}
    env.update(ANEX_COORDINATOR_URL="http://127.0.0.1:9", ANEX_STATE_DIR=str(tmp_path), ANEX_ENGINE="userspace")
    out = subprocess.run([sys.executable, "-m", "anex_agent", "run", "--", "true"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2, out
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert any("engine: userspace" in line for line in lines), lines
    assert "ANEX_JOIN_TOKEN" in lines[-1] and lines[-1].startswith("anex-agent run:"), lines


@pytest.mark.parametrize("env", [
    {"GW_TUNNEL_5432": "db:5²"},      # str.isdigit() accepts '²', int() refuses it: was a ValueError traceback
    {"GW_TUNNEL_5432": "db:٥٤٣٢"},   # Arabic-Indic digits: int() reads them, a port must not
    {"ANEX_INBOUND_PORTS": "8²"},
])
def test_non_ascii_digits_are_a_config_error_naming_the_variable(env):
    with pytest.raises(ConfigError) as err:
        parse({**BASE, **env})
    assert err.value.source == next(iter(env))


def test_non_ascii_digits_in_a_listen_address_are_a_config_error():
    with pytest.raises(ConfigError) as err:
        parse({**BASE, "ANEX_PROXY_LISTEN": "127.0.0.1:31²"})
    assert err.value.source == "ANEX_PROXY_LISTEN"


@pytest.mark.parametrize("value", [":3128", "[]:3128", "[::1:3128", "127.0.0.1:"])
def test_listen_needs_the_address_spelled_out(value):
    """The proxy's own parser reads ':PORT' as loopback; the agent's settings do not."""
    with pytest.raises(ConfigError) as err:
        parse({**BASE, "ANEX_API_LISTEN": value})
    assert err.value.source == "ANEX_API_LISTEN"


def test_path_settings_probe_interval_and_egress_proxy_variables():
    cfg = parse({**BASE, "ANEX_PATH": "websocket", "ANEX_PATH_PROBE_INTERVAL": "30",
                 "HTTPS_PROXY": "http://proxy:3128", "no_proxy": ".corp", "HTTP_PROXY": "", "OTHER": "x"})
    assert cfg.path == "websocket" and cfg.path_probe_interval == 30.0
    assert cfg.proxy_env == (("HTTPS_PROXY", "http://proxy:3128"), ("no_proxy", ".corp"))
    assert parse(BASE).path_probe_interval == 120.0  # the documented default
    assert parse(BASE, ["--path-probe-interval", "7"]).path_probe_interval == 7.0
    for bad in ("0", "1.5", "abc", "86401"):
        with pytest.raises(ConfigError) as err:
            parse({**BASE, "ANEX_PATH_PROBE_INTERVAL": bad})
        assert err.value.source == "ANEX_PATH_PROBE_INTERVAL"


def test_dead_peer_after_is_tunable_and_checked():
    assert parse(BASE).dead_peer_after == 2.0  # the documented default
    assert parse({**BASE, "ANEX_DEAD_PEER_AFTER": "5"}).dead_peer_after == 5.0
    assert parse({**BASE, "ANEX_DEAD_PEER_AFTER": "5"}, ["--dead-peer-after", "2"]).dead_peer_after == 2.0
    for bad in ("0", "-1", "x", "1.5"):
        with pytest.raises(ConfigError) as err:
            parse({**BASE, "ANEX_DEAD_PEER_AFTER": bad})
        assert err.value.source == "ANEX_DEAD_PEER_AFTER"


def test_ssh_port_default_off_and_bad_values():
    assert parse({**BASE, "ANEX_STATE_DIR": "/tmp/x"}).ssh_port == 2222
    assert parse({**BASE, "ANEX_SSH_PORT": "0"}).ssh_port == 0
    assert parse({**BASE, "ANEX_SSH_PORT": "2200"}, ["--ssh-port", "2300"]).ssh_port == 2300
    for bad in ("70000", "-1", "ssh", "２２"):
        with pytest.raises(ConfigError) as err:
            parse({**BASE, "ANEX_SSH_PORT": bad})
        assert "ANEX_SSH_PORT" in str(err.value)


def test_forward_max_connections_default_flag_and_bad_values():
    assert parse({**BASE, "ANEX_STATE_DIR": "/tmp/x"}).forward_max_connections == 1024
    assert parse({**BASE, "ANEX_FORWARD_MAX_CONNECTIONS": "50"}).forward_max_connections == 50
    assert parse({**BASE, "ANEX_FORWARD_MAX_CONNECTIONS": "50"},
                 ["--forward-max-connections", "7"]).forward_max_connections == 7
    for bad in ("0", "-1", "many", "2000000"):
        with pytest.raises(ConfigError) as err:
            parse({**BASE, "ANEX_FORWARD_MAX_CONNECTIONS": bad})
        assert "ANEX_FORWARD_MAX_CONNECTIONS" in str(err.value) and "connections" in str(err.value)


def test_proxy_max_connections_default_flag_and_bad_values():
    assert parse({**BASE, "ANEX_STATE_DIR": "/tmp/x"}).proxy_max_connections == 1024
    assert parse({**BASE, "ANEX_PROXY_MAX_CONNECTIONS": "50"}).proxy_max_connections == 50
    assert parse({**BASE, "ANEX_PROXY_MAX_CONNECTIONS": "50"},
                 ["--proxy-max-connections", "7"]).proxy_max_connections == 7
    for bad in ("0", "many", "2000000"):
        with pytest.raises(ConfigError) as err:
            parse({**BASE, "ANEX_PROXY_MAX_CONNECTIONS": bad})
        assert "ANEX_PROXY_MAX_CONNECTIONS" in str(err.value) and "each proxy" in str(err.value)
