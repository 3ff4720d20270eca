"""The pod's files and Secret variables the cluster pushes before the workload starts
(ANEX_POD_FILES, anex_agent.agent.pod_files, the push route's hook)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

import pytest

from anex_agent.agent import pod_files, run_options
from anex_agent.agent.pod_files import Delivery, Manifest
from anex_agent.agent.workload import Workload
from anex_agent.errors import ConfigError


def test_the_manifest_is_read_once_naming_the_variable(tmp_path):
    args = argparse.Namespace(grace_period=None, wait_ready=None)
    options = run_options.from_args(args, {"ANEX_POD_FILES": json.dumps({"dirs": ["/etc/app", "/etc/app/conf"]})})
    assert options.pod_files == Manifest((pod_files.POD_DIR, "/etc/app", "/etc/app/conf"))
    assert run_options.from_args(args, {}).pod_files is None
    for bad, said in (("[", "is not JSON"), ('{"dirs": "x"}', "expected"), ('{"dirs": ["etc"]}', "'etc'"),
                      ('{"dirs": ["/a/../b"]}', "'..'"), ('{"dirs": ["/"]}', "root directory"),
                      ('{"dirs": ["/var/lib"]}', "/var/lib/anex-agent"),
                      ('{"dirs": ["/var/lib/anex-agent/x"]}', "/var/lib/anex-agent")):
        with pytest.raises(ConfigError) as err:
            pod_files.parse(bad)
        assert err.value.source == "ANEX_POD_FILES" and said in str(err.value)


def test_prepare_creates_the_directories_the_cluster_may_push_into(tmp_path):
    wanted = Manifest((str(tmp_path / "app"), str(tmp_path / "app" / "conf")))
    assert pod_files.prepare(wanted) == wanted.dirs
    assert (tmp_path / "app" / "conf").is_dir()
    (tmp_path / "file").touch()
    with pytest.raises(ConfigError) as err:
        pod_files.prepare(Manifest((str(tmp_path / "file" / "below"),)))
    assert err.value.source == "ANEX_POD_FILES" and "below" in str(err.value)


def test_prepare_refuses_a_directory_over_or_under_the_agents_own(tmp_path):
    state = tmp_path / "state"
    for bad in (tmp_path, state, state / "below"):
        with pytest.raises(ConfigError) as err:
            pod_files.prepare(Manifest((str(bad),)), reserved=(str(state),))
        assert err.value.source == "ANEX_POD_FILES" and str(bad) in str(err.value) and str(state) in str(err.value)
    assert not (state / "below").exists()
    assert pod_files.prepare(Manifest((str(tmp_path / "app"),)), reserved=(str(state),)) == (str(tmp_path / "app"),)


async def test_the_workload_gets_the_secret_variables_expanded_and_their_file_goes(tmp_path):
    delivery = Delivery(Manifest((str(tmp_path),)), pod_dir=str(tmp_path))
    w = Workload([sys.executable, "-c", "x", "--password=$(PASSWORD)", "$(PLAIN)"],
                 env={"PLAIN": "p", "URL": "db://u:$(PASSWORD)@h"})
    waiting = asyncio.create_task(delivery.wait(), name="test-delivery")
    (tmp_path / "env.json").write_text(json.dumps({"PASSWORD": "s3cret"}))
    delivery.pushed(str(tmp_path / "env.json"))
    assert not waiting.done()  # the variables alone do not complete the delivery
    (tmp_path / "complete").touch()
    delivery.pushed(str(tmp_path / "complete"))
    await asyncio.wait_for(waiting, 30)
    delivery.apply(w)
    assert w.env == {"PLAIN": "p", "URL": "db://u:s3cret@h", "PASSWORD": "s3cret"}
    assert w.argv[3:] == ["--password=s3cret", "$(PLAIN)"]  # the provision's own references were expanded before
    assert not os.listdir(tmp_path)  # neither the variables nor the mark stay on disk
    (tmp_path / "env.json").write_text("{}")  # pushed again later (a restarted virtual node)
    delivery.pushed(str(tmp_path / "env.json"))
    assert not (tmp_path / "env.json").exists()


def test_without_secret_variables_the_environment_is_left_alone(tmp_path):
    delivery = Delivery(Manifest((str(tmp_path),)), pod_dir=str(tmp_path))
    w = Workload(["true"], env={"A": "1"})
    delivery.apply(w)
    assert w.env == {"A": "1"} and w.argv == ["true"]
