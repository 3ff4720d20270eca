"""What the workload of `anex-agent run` can see: no ANEX_* secret in its environment or in the
engine's, and with --user nothing of the agent's (state dir, /proc/<agent>/environ)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from integration.conftest import ns_state, run_agent

# the workload (root): its own environment, and that of every wireguard-go the agent (its parent) started
INSPECT = (
    "import json,os\n"
    "agent=os.getppid(); engines=[]\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "    try:\n"
    "        stat=open(f'/proc/{pid}/stat').read(); comm=stat[stat.index('(')+1:stat.rindex(')')]\n"
    "        ppid=int(stat[stat.rindex(')')+2:].split()[1])\n"
    "        if ppid==agent and comm.startswith('wireguard-go'):\n"
    "            raw=open(f'/proc/{pid}/environ','rb').read().decode()\n"
    "            engines.append(dict(kv.split('=',1) for kv in raw.split('\\0') if '=' in kv))\n"
    "    except (OSError, ValueError):\n"
    "        pass\n"
    "raw=lambda pid: open(f'/proc/{pid}/environ','rb').read().decode('latin-1')\n"
    "print('INSPECT', json.dumps({'env': dict(os.environ), 'engines': engines, 'agent_environ': raw(agent),\n"
    "                             'own_environ': raw('self')}), flush=True)\n"
)


def test_workload_and_engine_get_no_anex_secret(mesh, fresh_node):
    env = mesh.agent_env(fresh_node, ANEX_PROXY_AUTH="u:pw", ANEX_PROVIDER="onprem", GW_TUNNEL_18090="db:5432")
    token = env["ANEX_JOIN_TOKEN"]
    out = run_agent(fresh_node, env, ["--", sys.executable, "-c", INSPECT])
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "mesh up" in text  # the agent did join with the token
    seen = json.loads(next(l for l in out.stdout.splitlines() if l.startswith("INSPECT "))[len("INSPECT "):])
    workload = seen["env"]
    assert not {"ANEX_JOIN_TOKEN", "ANEX_PROXY_AUTH", "ANEX_COORDINATOR_URL", "ANEX_STATE_DIR"} & set(workload)
    assert token not in json.dumps(workload) and "u:pw" not in json.dumps(workload)
    assert workload["ANEX_NODE_NAME"] == env["ANEX_NODE_NAME"] and workload["GW_TUNNEL_18090"] == "db:5432"
    # what a root workload reads of the agent's start-up environment (/proc/<agent pid>/environ) and its own
    for raw in (seen["agent_environ"], seen["own_environ"]):
        assert token not in raw and "u:pw" not in raw
    assert f"ANEX_NODE_NAME={env['ANEX_NODE_NAME']}" in seen["agent_environ"]
    assert len(seen["engines"]) == 1, seen["engines"]  # the wireguard-go this agent started
    engine = seen["engines"][0]
    assert "PATH" in engine and engine.get("WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD") == "1"
    assert not [n for n in engine if not (n in ("PATH", "LOG_LEVEL") or n.startswith(("WG_", "GO")))], engine
    assert ns_state(fresh_node.ns)["pids"] == []


def test_user_runs_the_workload_as_that_account_locked_out_of_the_agent(mesh, fresh_node):
    shared = Path(tempfile.mkdtemp(prefix="anex-it-user-"))
    try:
        shared.chmod(0o755)  # nobody may enter the parent ...
        state = shared / "state"
        state.mkdir(mode=0o755)  # ... and, until the agent fixes it, the state dir
        os.chmod(state, 0o755)
        script = (
            'echo "WHO $(id -u) $(id -g) $HOME $USER $LOGNAME ${ANEX_JOIN_TOKEN:-no-token}"; '
            f'ls {state} >/dev/null 2>&1 && echo STATE-LISTED || echo STATE-DENIED; '
            f'cat {state}/private.key >/dev/null 2>&1 && echo KEY-READ || echo KEY-DENIED; '
            'cat /proc/$PPID/environ >/dev/null 2>&1 && echo AGENT-ENV-READ || echo AGENT-ENV-DENIED; '
            'kill -0 $PPID 2>/dev/null && echo AGENT-SIGNALLED || echo AGENT-SIGNAL-DENIED'
        )
        env = mesh.agent_env(fresh_node, ANEX_STATE_DIR=str(state))
        out = run_agent(fresh_node, env, ["--user", "nobody", "--", "/bin/sh", "-c", script])
        text = out.stdout + out.stderr
        assert out.returncode == 0, text
        import pwd

        nobody = pwd.getpwnam("nobody")
        assert f"WHO {nobody.pw_uid} {nobody.pw_gid} {nobody.pw_dir} nobody nobody no-token" in out.stdout, text
        for line in ("STATE-DENIED", "KEY-DENIED", "AGENT-ENV-DENIED", "AGENT-SIGNAL-DENIED"):
            assert line in out.stdout, text
        assert "was mode 0755" in text and "set to 0700" in text
        assert (state.stat().st_mode & 0o777, state.stat().st_uid) == (0o700, os.geteuid())
        assert (state / "private.key").exists()
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_token_given_to_a_node_that_already_joined_is_reported_unused_and_unreadable(mesh, fresh_node):
    env = mesh.agent_env(fresh_node)
    first = run_agent(fresh_node, env, ["--", "true"])
    assert first.returncode == 0 and "joined" in first.stdout + first.stderr, first.stderr[-2000:]
    fresh = mesh.join_token("node")  # a restart with the saved credential and a new token in the environment
    out = run_agent(fresh_node, {**env, "ANEX_JOIN_TOKEN": fresh}, ["--", sys.executable, "-c", INSPECT])
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "re-using node identity" in text and "a join token was given but not used" in text
    seen = json.loads(next(l for l in out.stdout.splitlines() if l.startswith("INSPECT "))[len("INSPECT "):])
    assert fresh not in seen["agent_environ"] and fresh not in seen["own_environ"] and fresh not in text
