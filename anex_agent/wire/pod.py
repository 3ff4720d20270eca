"""What the virtual node and the agent agree on about a pod (shared by both roles, beside
:mod:`anex_agent.wire.provisioning`): the variables the virtual node puts in a provision's ``env``
for the agent, the paths of the files it pushes, and Kubernetes' ``$(VAR)`` expansion, which
one side applies, once: the virtual node to the provision of a pod without variables from
Secrets; for a pod with some, the agent, to the raw templates (the provision's command and
arguments, :data:`ENV_FILE`'s ``value`` entries), with the values never reaching the coordinator.

* ``ANEX_PROBES`` (:data:`PROBES_ENV`): the container's probes, read by
  :mod:`anex_agent.agent.probe_spec`;
* ``ANEX_POD_FILES`` (:data:`POD_FILES_ENV`): ``{"dirs": [...]}``, the directories of the pod's
  files; the agent holds the workload until :data:`COMPLETE` is pushed, after the files and the
  variables from Secrets (:data:`ENV_FILE`) (:mod:`anex_agent.agent.pod_files`); neither side
  accepts the root directory nor one over or under the agent's own (:func:`unsafe_dir`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

PROBES_ENV = "ANEX_PROBES"
POD_FILES_ENV = "ANEX_POD_FILES"
POD_DIR = "/run/anex-pod"
ENV_FILE = f"{POD_DIR}/env.json"  # every variable of a pod with some from Secrets: JSON [[NAME, VALUE, TEMPLATE]]
COMPLETE = f"{POD_DIR}/complete"  # pushed last: every file of the pod is there
# directories a pod's files may never be written in, over or under: the agent's own (its state
# directory as root; the running agent adds its actual state and install directories)
AGENT_DIRS = ("/var/lib/anex-agent",)


def unsafe_dir(path: str, reserved: tuple[str, ...] = AGENT_DIRS) -> str | None:
    """Why the normalized absolute directory ``path`` may not hold a pod's files (None: it may):
    the root, or a directory that is, holds or lies in one of ``reserved``."""
    parts = [p for p in path.split("/") if p]
    if not parts:
        return "the root directory cannot hold a pod's files"
    for other in reserved:
        theirs = [p for p in str(other).split("/") if p]
        common = min(len(parts), len(theirs))
        if parts[:common] == theirs[:common]:
            return f"it overlaps the agent's own directory {other}"
    return None


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: a defined variable is replaced, ``$$`` is one ``$`` (so
    ``$$(VAR)`` stays ``$(VAR)``), a reference to an undefined variable is left as it is."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        if text.startswith("$(", i):
            end = text.find(")", i + 2)
            if end != -1 and text[i + 2:end] in env:
                out.append(env[text[i + 2:end]])
                i = end + 1
                continue
        out.append(text[i])
        i += 1
    return "".join(out)


def resolve(variables: Iterable[tuple[str, str, bool]]) -> dict[str, str]:
    """A container's variables, given in Kubernetes' order (``envFrom`` then ``env``) as
    ``(name, value, template)``, defined as a kubelet defines them: a template (an ``env`` entry's
    ``value``) is expanded once (:func:`expand`) against the variables defined before it; any other
    value (from a Secret, a ConfigMap, a field) is taken as it is; a later definition wins."""
    out: dict[str, str] = {}
    for name, value, template in variables:
        out[name] = expand(value, out) if template else value
    return out
