"""What the workload and the engines inherit: no ANEX_* secret, engines next to nothing."""

from __future__ import annotations

import asyncio

import pytest

from anex_agent.host import childenv
from anex_agent.errors import EngineError

AGENT_ENV = {
    "PATH": "/usr/local/bin:/usr/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "ANEX_JOIN_TOKEN": "anexjt_secret",
    "ANEX_PROXY_AUTH": "u:pw",
    "ANEX_GATEWAY_TOKEN": "anexjt_gw",
    "ANEX_ADMIN_TOKEN": "anexadm_x",
    "ANEX_JOIN_TOKEN_FILE": "/run/secrets/token",
    "ANEX_SOMETHING_NEW": "unknown names are withheld too",
    "ANEX_COORDINATOR_URL": "https://user:pw@coord.example",
    "ANEX_STATE_DIR": "/var/lib/anex-agent",
    "ANEX_WORKLOAD_USER": "nobody",
    "ANEX_PROXY_LISTEN": "127.0.0.1:3128",
    "ANEX_API_LISTEN": "127.0.0.1:9555",
    "ANEX_NODE_NAME": "n1",
    "ANEX_PROVIDER": "vastai",
    "GW_TUNNEL_5432": "db:5432",
    "LOG_LEVEL": "debug",
    "WG_PROCESS_FOREGROUND": "1",
    "GOMAXPROCS": "2",
}


def test_workload_env_withholds_every_anex_name_but_the_allow_list():
    env = childenv.workload_env(AGENT_ENV)
    assert sorted(n for n in env if n.startswith("ANEX_")) == [
        "ANEX_API_LISTEN", "ANEX_NODE_NAME", "ANEX_PROVIDER", "ANEX_PROXY_LISTEN"
    ]
    assert not {"anexjt_secret", "u:pw", "anexjt_gw", "anexadm_x"} & set(env.values())
    for name in ("PATH", "HOME", "LANG", "GW_TUNNEL_5432", "LOG_LEVEL"):
        assert env[name] == AGENT_ENV[name]
    assert "ANEX_JOIN_TOKEN" in AGENT_ENV  # the input is not changed


def test_workload_env_for_an_account_sets_home_user_logname():
    account = childenv.AccountInfo("nobody", 65534, 65534, "/nonexistent", (65534,))
    env = childenv.workload_env(AGENT_ENV, account)
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == ("/nonexistent", "nobody", "nobody")


def test_allow_list_holds_no_secret_name():
    for name in childenv.WORKLOAD_ALLOWED:
        assert not any(word in name for word in ("TOKEN", "AUTH", "PASSWORD", "SECRET", "KEY", "URL", "CREDENTIAL"))


def test_engine_env_is_minimal():
    assert childenv.engine_env(AGENT_ENV) == {
        "PATH": "/usr/local/bin:/usr/bin", "LOG_LEVEL": "debug", "WG_PROCESS_FOREGROUND": "1", "GOMAXPROCS": "2"
    }
    assert childenv.engine_env({})["PATH"]  # the system default when the agent has none


def test_scrub_environ_removes_withheld_names_in_place():
    env = dict(AGENT_ENV)
    removed = childenv.scrub_environ(env)
    assert "ANEX_JOIN_TOKEN" in removed and "ANEX_COORDINATOR_URL" in removed
    assert env == childenv.workload_env(AGENT_ENV)


async def test_wireguard_go_is_spawned_with_the_engine_env(monkeypatch, tmp_path):
    """The spawn call itself: the agent's ANEX_* secrets and HOME do not reach wireguard-go."""
    from anex_agent.tunnels.engines import wireguard_go

    monkeypatch.setenv("ANEX_JOIN_TOKEN", "anexjt_secret")
    monkeypatch.setenv("ANEX_PROXY_AUTH", "u:pw")
    seen = {}

    async def fake_exec(*argv, env=None, **kw):
        seen.update(argv=argv, env=env)
        raise OSError(2, "stop here")

    monkeypatch.setattr(asyncio, "create_subprocess_exec", fake_exec)
    engine = wireguard_go.WireguardGoEngine(ifname="anxtest0", binary="/bin/false", socket_dir=str(tmp_path))
    with pytest.raises(EngineError):
        await engine.start()
    assert seen["argv"][0] == "/bin/false"
    env = seen["env"]
    assert env[wireguard_go.ENV_PREFER_USERSPACE] == "1" and "PATH" in env
    assert set(env) <= {"PATH", *childenv.ENGINE_NAMES} | {n for n in env if n.startswith("WG_")}
    assert not any(n.startswith("ANEX_") for n in env) and "HOME" not in env
