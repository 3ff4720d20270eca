"""The SOCKS5 proxy's settings: off by default, its address and credentials parsed once, who may connect."""

from __future__ import annotations

import argparse
import socket

import pytest

from anex_agent.host import childenv
from anex_agent.agent import engine_frontends
from anex_agent.agent import settings as s
from anex_agent.errors import ConfigError
from anex_agent.tunnels.engines.registry import engine_classes
from anex_agent.tunnels.engines.wireproxy import WireproxyEngine

BASE = {"ANEX_COORDINATOR_URL": "http://10.0.0.1:8080", "ANEX_JOIN_TOKEN": "tok", "ANEX_STATE_DIR": "/tmp/x"}


def parse(env, argv=()):
    parser = argparse.ArgumentParser()
    s.add_arguments(parser)
    return s.from_args(parser.parse_args(list(argv)), env)


def test_off_by_default():
    cfg = parse(BASE)
    assert cfg.socks_listen is None and cfg.socks_auth is None
    assert parse({**BASE, "ANEX_SOCKS_LISTEN": ""}).socks_listen is None
    assert engine_frontends.workload_config(None, cfg).socks_address == ""


def test_on_where_asked_the_flag_winning():
    assert str(parse({**BASE, "ANEX_SOCKS_LISTEN": "127.0.0.1:1080"}).socks_listen) == "127.0.0.1:1080"
    assert str(parse({**BASE, "ANEX_SOCKS_LISTEN": "localhost:1081"}).socks_listen) == "127.0.0.1:1081"
    cfg = parse({**BASE, "ANEX_SOCKS_LISTEN": "127.0.0.1:1080"}, ["--socks-listen", "[::1]:1090"])
    assert str(cfg.socks_listen) == "[::1]:1090"
    workload = engine_frontends.workload_config(None, cfg)
    assert (workload.socks_address, workload.socks_auth) == ("[::1]:1090", False)


@pytest.mark.parametrize("value", ["1080", "127.0.0.1", "127.0.0.1:0", "proxy.example:1080", "::1:1080", "127.0.0.1:1o80"])
def test_a_bad_address_names_the_variable_and_what_is_accepted(value):
    with pytest.raises(ConfigError) as err:
        parse({**BASE, "ANEX_SOCKS_LISTEN": value})
    assert err.value.source == "ANEX_SOCKS_LISTEN" and "HOST:PORT" in str(err.value)
    with pytest.raises(ConfigError) as err:
        parse(BASE, ["--socks-listen", value])
    assert err.value.source == "--socks-listen"


@pytest.mark.parametrize("address", ["0.0.0.0:1080", "[::]:1080", "10.0.0.5:1080"])
def test_beyond_loopback_requires_credentials(address):
    with pytest.raises(ConfigError) as err:
        parse({**BASE, "ANEX_SOCKS_LISTEN": address})
    assert err.value.source == "ANEX_SOCKS_LISTEN" and "needs credentials" in str(err.value)
    cfg = parse({**BASE, "ANEX_SOCKS_LISTEN": address, "ANEX_SOCKS_AUTH": "alice:s3cret"})
    assert cfg.socks_auth.username == "alice" and cfg.socks_auth.password == "s3cret"
    assert "s3cret" not in repr(cfg)
    assert engine_frontends.workload_config(None, cfg).socks_auth is True


def test_credentials_from_a_file_and_their_errors(tmp_path):
    (tmp_path / "auth").write_text("alice:pa:ss\n")
    cfg = parse({**BASE, "ANEX_SOCKS_LISTEN": "127.0.0.1:1080"}, ["--socks-auth-file", str(tmp_path / "auth")])
    assert (cfg.socks_auth.username, cfg.socks_auth.password) == ("alice", "pa:ss")
    cfg = parse({**BASE, "ANEX_SOCKS_LISTEN": "127.0.0.1:1080", "ANEX_SOCKS_AUTH_FILE": str(tmp_path / "auth")})
    assert cfg.socks_auth.password == "pa:ss"
    (tmp_path / "bad").write_text("nocolon\n")
    with pytest.raises(ConfigError) as err:
        parse({**BASE, "ANEX_SOCKS_LISTEN": "127.0.0.1:1080", "ANEX_SOCKS_AUTH_FILE": str(tmp_path / "bad")})
    assert err.value.source == "ANEX_SOCKS_AUTH_FILE" and "USER:PASSWORD" in str(err.value)


def test_credentials_without_the_proxy_are_a_mistake_named():
    with pytest.raises(ConfigError) as err:
        parse({**BASE, "ANEX_SOCKS_AUTH": "alice:s3cret"})
    assert err.value.source == "ANEX_SOCKS_AUTH" and "ANEX_SOCKS_LISTEN" in str(err.value)


@pytest.mark.parametrize("extra", [{}, {"ANEX_PROXY_LISTEN": "0.0.0.0:1080"}, {"ANEX_API_LISTEN": "127.0.0.1:1080"}])
def test_the_same_port_as_another_listener_is_refused(extra):
    env = {**BASE, "ANEX_SOCKS_LISTEN": "127.0.0.1:1080", "ANEX_PROXY_AUTH": "u:p", **extra}
    if not extra:
        env["ANEX_SOCKS_LISTEN"] = "127.0.0.1:3128"
    with pytest.raises(ConfigError) as err:
        parse(env)
    assert err.value.source == "ANEX_SOCKS_LISTEN" and "choose another port" in str(err.value)


def test_never_an_inbound_port():
    with pytest.raises(ConfigError) as err:
        parse({**BASE, "ANEX_SOCKS_LISTEN": "127.0.0.1:1080", "ANEX_INBOUND_PORTS": "8000,1080"})
    assert err.value.source == "ANEX_INBOUND_PORTS" and "SOCKS5" in str(err.value)


def test_a_taken_port_names_the_variable():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = parse({**BASE, "ANEX_SOCKS_LISTEN": f"127.0.0.1:{port}", "ANEX_PROXY_LISTEN": "127.0.0.1:1",
                     "ANEX_API_LISTEN": "127.0.0.1:2"})
        with pytest.raises(ConfigError) as err:
            s.check_ports_free(cfg)
    assert err.value.source == "ANEX_SOCKS_LISTEN"


def test_the_workload_sees_the_address_never_the_credentials():
    env = childenv.workload_env({"ANEX_SOCKS_LISTEN": "127.0.0.1:1080", "ANEX_SOCKS_AUTH": "alice:s3cret",
                                 "ANEX_SOCKS_AUTH_FILE": "/run/secret"})
    assert env == {"ANEX_SOCKS_LISTEN": "127.0.0.1:1080"}


def test_wireproxy_serves_it_without_credentials_only():
    cfg = parse({**BASE, "ANEX_SOCKS_LISTEN": "127.0.0.1:1080", "ANEX_SOCKS_AUTH": "alice:s3cret"})
    with pytest.raises(ConfigError) as err:
        engine_frontends.check_settings(cfg, WireproxyEngine)
    assert err.value.source == "ANEX_SOCKS_AUTH" and "wireproxy" in str(err.value)
    for cls in engine_classes().values():  # engines that give a dialer: our SOCKS5 proxy asks for them
        if cls.frontends == "dialer":
            engine_frontends.check_settings(cfg, cls)
    engine_frontends.check_settings(parse({**BASE, "ANEX_SOCKS_LISTEN": "127.0.0.1:1080"}), WireproxyEngine)


def test_wireproxy_renders_its_socks5_section_only_when_on():
    from anex_agent.wire.keys import KeyPair, generate_private_key
    from anex_agent.tunnels.engines.config import DesiredConfig, PeerConfig
    from anex_agent.tunnels.engines.wireproxy_config import WireproxyOptions, render_config

    desired = DesiredConfig(private_key=generate_private_key(), listen_port=None, address="10.254.0.5/16", mtu=1400,
                            peers=(PeerConfig(public_key=KeyPair(generate_private_key()).public_b64,
                                              endpoint="192.0.2.1:51820", allowed_ips=("10.254.0.0/16",)),))
    off = render_config(desired, WireproxyOptions())
    on = render_config(desired, WireproxyOptions(socks_address="127.0.0.1:1080"))
    assert "[Socks5]" not in off
    assert on == off + "\n[Socks5]\nBindAddress = 127.0.0.1:1080\n"
    with pytest.raises(ConfigError) as err:
        WireproxyOptions(socks_address="127.0.0.1:3128")  # the HTTP proxy's address
    assert err.value.source == "client_tunnels"
    with pytest.raises(ConfigError) as err:
        WireproxyOptions(socks_address="localhost:1080")
    assert err.value.source == "socks_address"
