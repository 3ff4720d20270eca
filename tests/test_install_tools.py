"""scripts/install-tools with stand-ins for ``go`` and ``cargo`` on PATH: what it asks them
to build, the cache entries it leaves (only whole ones), and its answers to bad input."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "install-tools"

# A `go` that records its arguments and "builds" by writing the -o files; FAKE_GO_FAIL=1
# makes `go build` fail after writing some of them (a half-built entry).
FAKE_GO = r'''#!/usr/bin/env bash
set -euo pipefail
echo "$*" >>"$FAKE_LOG"
case "$1 ${2:-}" in
  "env GOVERSION") echo go1.26.0 ;;
  "mod download")
    mod="$FAKE_DIR/kubernetes.mod"
    printf 'module k8s.io/kubernetes\n\ngo 1.26.0\n\nrequire (\n\tgithub.com/x/y v1.0.0\n\tk8s.io/api v0.0.0\n\tk8s.io/client-go v0.0.0\n)\n' >"$mod"
    printf '{\n\t"Path": "k8s.io/kubernetes",\n\t"GoMod": "%s",\n\t"Dir": "/nowhere"\n}\n' "$mod" ;;
  "mod edit") ;;
  build*)
    shift; out=""; pkgs=()
    while [ $# -gt 0 ]; do
      case $1 in -o) out=$2; shift 2 ;; -p|-ldflags) shift 2 ;; *) pkgs+=("$1"); shift ;; esac
    done
    if [[ $out == */ ]]; then
      mkdir -p "$out"; for p in "${pkgs[@]}"; do printf '#!/bin/sh\n' >"$out/${p##*/}"; chmod +x "$out/${p##*/}"; done
    else
      mkdir -p "$(dirname "$out")"; printf '#!/bin/sh\n' >"$out"; chmod +x "$out"
    fi
    [ -z "${FAKE_GO_FAIL:-}" ] || { echo "go: build failed" >&2; exit 1; } ;;
  *) echo "fake go: unexpected $*" >&2; exit 2 ;;
esac
'''


@pytest.fixture
def env(tmp_path: Path) -> dict:
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    go = bin_dir / "go"
    go.write_text(FAKE_GO)
    go.chmod(go.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "ANEX_TOOLS_DIR": str(tmp_path / "tools"),
            "FAKE_LOG": str(tmp_path / "go.log"), "FAKE_DIR": str(tmp_path), "ANEX_TOOLS": ""}


def run(env: dict, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], env={**env, **extra}, capture_output=True, text=True,
                          timeout=60)


def go_calls(env: dict) -> list[str]:
    log = Path(env["FAKE_LOG"])
    return log.read_text().splitlines() if log.exists() else []


def test_kube_builds_the_five_programs_with_the_staging_modules_replaced_by_their_releases(env):
    result = run(env, "kube")
    assert result.returncode == 0, result.stderr
    tools = Path(env["ANEX_TOOLS_DIR"])
    entry = next(tools.glob("kubernetes-*"))
    version = entry.name.removeprefix("kubernetes-")
    minor_patch = version.split(".", 1)[1]
    programs = ["kube-apiserver", "kube-scheduler", "kube-controller-manager", "kube-proxy", "kubectl"]
    assert sorted(p.name for p in (entry / "bin").iterdir()) == sorted(programs)
    assert f"version={version}" in (entry / ".stamp").read_text()
    assert all((tools / "bin" / p).resolve() == entry / "bin" / p for p in programs)
    calls = go_calls(env)
    assert f"mod edit -replace=k8s.io/api=k8s.io/api@v0.{minor_patch}" in calls
    assert f"mod edit -replace=k8s.io/client-go=k8s.io/client-go@v0.{minor_patch}" in calls
    assert not any("github.com/x/y" in c for c in calls)  # only the k8s.io modules at v0.0.0
    assert f"mod edit -require=k8s.io/kubernetes@v{version}" in calls
    assert list(tools.glob(".build-*")) == []


def test_a_cached_entry_is_not_built_again(env):
    assert run(env, "etcd").returncode == 0
    before = len(go_calls(env))
    again = run(env, "etcd")
    assert again.returncode == 0, again.stderr
    assert "cached in" in again.stdout
    assert len(go_calls(env)) == before


def test_a_failed_build_leaves_no_entry_and_names_the_tool(env):
    result = run(env, "etcd", FAKE_GO_FAIL="1")
    assert result.returncode != 0
    assert "etcd" in result.stderr and "nothing was cached" in result.stderr
    tools = Path(env["ANEX_TOOLS_DIR"])
    assert sorted(p.name for p in tools.iterdir() if not p.name.startswith(".lock")) == []


def test_an_entry_without_its_stamp_is_built_again(env):
    assert run(env, "wireproxy").returncode == 0
    entry = next(Path(env["ANEX_TOOLS_DIR"]).glob("wireproxy-*"))
    (entry / ".stamp").unlink()
    before = len(go_calls(env))
    assert run(env, "wireproxy").returncode == 0
    assert len(go_calls(env)) > before
    assert (entry / ".stamp").is_file()


def test_one_failed_tool_does_not_stop_the_others(env, tmp_path):
    cargo = tmp_path / "fakebin" / "cargo"
    cargo.write_text("#!/bin/sh\necho 'error: could not find crate' >&2\nexit 101\n")
    cargo.chmod(0o755)
    result = run(env, "wstunnel", "etcd")
    assert result.returncode != 0
    assert "failed to build: wstunnel" in result.stderr
    assert (Path(env["ANEX_TOOLS_DIR"]) / "bin" / "etcd").exists()


def test_tools_can_be_chosen_by_the_environment(env):
    assert run(env, ANEX_TOOLS="etcd").returncode == 0
    assert [p.name for p in (Path(env["ANEX_TOOLS_DIR"]) / "bin").iterdir()] == ["etcd"]


def test_an_unknown_tool_is_one_line_naming_what_is_accepted(env):
    result = run(env, "kubernetes")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "install-tools: unknown tool 'kubernetes' (accepted: kube etcd wireproxy wstunnel)"]
