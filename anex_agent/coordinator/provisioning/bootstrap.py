"""Booting the agent on a rented machine, with nothing but the coordinator to talk to.

Contract:

* :func:`issue` creates the machine's credentials inside the caller's transaction: a
  **single-use node join token bound to one provision** (``join_tokens.provision_id``,
  :data:`MIGRATION`), expiring at ``expires_at`` (the provision's boot timeout), carrying the
  label ``anex.sh/provision: <id>`` (a join copies a token's labels onto its node, so the node
  says which provision it belongs to) and, when given, limited to the provider. Only the
  token's hash is stored; the secret is in the returned :class:`BootCredentials` once.
* :func:`node_of_provision` is the (newest) node that joined with a provision's token (None before the
  join): the provisioning loop polls it to see the machine come up. Keep the token row while
  the provision lives (revoking it forgets the binding).
* :func:`boot_env` is the agent's environment on the machine (an image whose entrypoint is
  the agent): ``ANEX_COORDINATOR_URL``, ``ANEX_JOIN_TOKEN``, and ``ANEX_PROVIDER`` /
  ``ANEX_NODE_NAME`` / ``ANEX_CA_FILE`` when given. The agent strips every ``ANEX_*`` secret
  from the workload's environment.
* :func:`start_script` is a POSIX ``sh`` script for any other image (no Python, no curl
  needed): it downloads the single-file agent from the coordinator only
  (``GET /v1/agent/<uname -m>``, the join token as bearer; curl, else wget, else bash's
  ``/dev/tcp`` for an ``http://`` coordinator), checks its SHA-256 against the one baked into
  the script and refuses to run anything on a mismatch, keeps a checked copy (a restarted
  container does not download again), writes the join token to a 0600 file
  (``ANEX_JOIN_TOKEN_FILE``: it is in no process environment), and ``exec``\\ s
  ``anex-agent run -- COMMAND...``. Every value is single-quoted, so any argv survives.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from anex_agent.coordinator import tokens
from anex_agent.coordinator.db import Conn
from anex_agent.coordinator.migrations import Migration

PROVISION_LABEL = "anex.sh/provision"
AGENT_PATH = "/v1/agent"  # + "/<arch>": the download route
DEFAULT_STATE_DIR = "/var/lib/anex-agent"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ARCH = re.compile(r"^[A-Za-z0-9_-]{1,32}$")

MIGRATION = Migration(
    450,
    "join tokens bound to a provision",
    """
    ALTER TABLE join_tokens ADD COLUMN provision_id TEXT;
    CREATE INDEX join_tokens_provision ON join_tokens (provision_id)
    """,
)


@dataclass(frozen=True)
class BootCredentials:
    """What a rented machine needs to join: the token's secret (shown once) and its id."""

    secret: str = field(repr=False)
    token_id: str


async def issue(tx: Conn, provision_id: str, *, expires_at: float, now: float,
                provider: str | None = None) -> BootCredentials:
    """A single-use join token for the machine of ``provision_id``, good until ``expires_at``;
    with ``provider`` (``vastai``, ``runpod``, ...) a join naming another provider is refused."""
    if not provision_id:
        raise ValueError("provision_id is empty")
    if not expires_at > now:
        raise ValueError("expires_at must lie after now")
    secret, token_id = await tokens.create_for_provision(
        tx, provision_id, expires_at=expires_at, now=now, labels={PROVISION_LABEL: provision_id},
        providers=[provider] if provider else None)
    return BootCredentials(secret=secret, token_id=token_id)


async def node_of_provision(tx: Conn, provision_id: str) -> str | None:
    """The id of the node that joined with one of ``provision_id``'s tokens (the newest), or None."""
    return await tx.fetchval(
        "SELECT n.id FROM nodes n JOIN join_tokens t ON t.id = n.join_token_id"
        " WHERE t.provision_id = $1 ORDER BY n.created_at DESC, n.id DESC LIMIT 1",
        provision_id,
    )


def boot_env(coordinator_url: str, secret: str, *, provider: str | None = None, node_name: str | None = None,
             ca_file: str | None = None) -> dict[str, str]:
    """The agent's environment for joining (see :mod:`anex_agent.agent.settings`)."""
    env = {"ANEX_COORDINATOR_URL": coordinator_url, "ANEX_JOIN_TOKEN": secret}
    if provider:
        env["ANEX_PROVIDER"] = provider
    if node_name:
        env["ANEX_NODE_NAME"] = node_name
    if ca_file:
        env["ANEX_CA_FILE"] = ca_file
    return env


def agent_url(coordinator_url: str) -> str:
    """The download URL without the architecture: ``<coordinator>/v1/agent``."""
    return coordinator_url.rstrip("/") + AGENT_PATH


_SCRIPT = r"""#!/bin/sh
# anex-agent bootstrap: fetch the agent from the coordinator, check it, run the workload under it.
set -u
coordinator=@COORDINATOR@
arch=$(uname -m)
@SHA256@
state=@STATE@
umask 077
say() { printf 'anex-agent bootstrap: %s\n' "$*" >&2; }
mkdir -p "$state" 2>/dev/null || state="${HOME:-/tmp}/.anex-agent"
mkdir -p "$state" || { say "cannot create $state"; exit 1; }
token_file="$state/join-token"
printf '%s\n' @SECRET@ > "$token_file" || { say "cannot write $token_file"; exit 1; }
agent="$state/anex-agent"
url="$coordinator@AGENT_PATH@/$arch"
@CA@
have() { command -v "$1" >/dev/null 2>&1; }
digest() {
    if have sha256sum; then sha256sum "$1" | cut -d ' ' -f 1
    elif have shasum; then shasum -a 256 "$1" | cut -d ' ' -f 1
    elif have openssl; then openssl dgst -sha256 "$1" | sed 's/^.*= *//'
    else say "no sha256sum, shasum or openssl to check the agent with"; return 1
    fi
}
fetch_tcp() {  # an http:// URL through bash's /dev/tcp (no curl, no wget)
    case $1 in http://*) ;; *) say "neither curl nor wget, and $1 is not http://"; return 1 ;; esac
    have bash || { say "neither curl, wget nor bash to download with"; return 1; }
    bash -c '
        cr=$(printf "\r")
        rest=${1#http://}; hostport=${rest%%/*}; path=/${rest#*/}
        case $hostport in
            \[*\]:*) host=${hostport%]:*}; host=${host#[}; port=${hostport##*]:} ;;
            \[*\]) host=${hostport#[}; host=${host%]}; port=80 ;;
            *:*) host=${hostport%:*}; port=${hostport##*:} ;;
            *) host=$hostport; port=80 ;;
        esac
        exec 3<>"/dev/tcp/$host/$port" || exit 1
        printf "GET %s HTTP/1.0\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n" \
            "$path" "$hostport" "$(cat "$3")" >&3
        IFS= read -r status <&3 || exit 1
        case $status in "HTTP/1."?" 200"*) ;; *) printf "%s\n" "${status%"$cr"}" >&2; exit 1 ;; esac
        while IFS= read -r line <&3; do line=${line%"$cr"}; [ -z "$line" ] && break; done
        cat <&3 > "$2"
    ' fetch "$1" "$2" "$token_file"
}
fetch() {  # URL OUT
    auth="Authorization: Bearer $(cat "$token_file")"
    if have curl; then
        if [ -n "$ca_file" ]; then curl -fsSL --cacert "$ca_file" -H "$auth" -o "$2" "$1"
        else curl -fsSL -H "$auth" -o "$2" "$1"; fi
    elif have wget; then
        if [ -n "$ca_file" ]; then wget -q --ca-certificate="$ca_file" --header="$auth" -O "$2" "$1"
        else wget -q --header="$auth" -O "$2" "$1"; fi
    else fetch_tcp "$1" "$2"
    fi
}
if [ ! -x "$agent" ] || [ "$(digest "$agent")" != "$sha256" ]; then
    tries=0
    while :; do
        rm -f "$agent.part"
        if fetch "$url" "$agent.part"; then break; fi
        tries=$((tries + 1))
        [ "$tries" -ge 5 ] && { say "could not download $url"; exit 1; }
        sleep 2
    done
    got=$(digest "$agent.part") || exit 1
    if [ "$got" != "$sha256" ]; then
        rm -f "$agent.part"
        say "checksum mismatch for $url: got ${got:-nothing}, expected $sha256; refusing to run it"
        exit 1
    fi
    chmod 700 "$agent.part" && mv -f "$agent.part" "$agent" || exit 1
fi
export ANEX_COORDINATOR_URL="$coordinator" ANEX_JOIN_TOKEN_FILE="$token_file" ANEX_STATE_DIR="$state"
unset ANEX_JOIN_TOKEN
@EXPORTS@
exec "$agent" run -- @COMMAND@
"""


def start_script(coordinator_url: str, secret: str, sha256: str | Mapping[str, str], command: Sequence[str], *,
                 env: Mapping[str, str] | None = None, ca_pem: str | None = None,
                 state_dir: str = DEFAULT_STATE_DIR) -> str:
    """The POSIX sh start script (see the module docstring). ``sha256``: the agent's hex SHA-256,
    or one per architecture (``{"x86_64": ..., "aarch64": ...}``, as ``uname -m`` names them and
    :func:`anex_agent.coordinator.routes.agent_download.agent_sha256s` gives them); on a machine
    of another architecture the script stops before downloading. ``env``: more variables for the
    agent (``ANEX_PROVIDER``, ``ANEX_NODE_NAME``, ...); ``ca_pem``: CA certificates to trust for
    an ``https://`` coordinator (written beside the agent, used for the download and by the
    agent as ``ANEX_CA_FILE``)."""
    hashes = {"*": sha256} if isinstance(sha256, str) else dict(sha256)
    if not hashes or not all(_SHA256.match(h) for h in hashes.values()):
        raise ValueError("sha256 must be 64 lowercase hex digits (per architecture)")
    if not all(arch == "*" or _ARCH.match(arch) for arch in hashes):
        raise ValueError("architectures are names as uname -m gives them (x86_64, aarch64)")
    if not command:
        raise ValueError("command is empty: the agent runs a workload")
    values = [coordinator_url, secret, state_dir, *command, *(env or {}).values(), *(env or {}).keys(), ca_pem or ""]
    if any("\0" in v for v in values):
        raise ValueError("a value holds a NUL character, which no argv or environment can carry")
    for name in env or {}:
        if not _ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not an environment variable name")
    ca = 'ca_file=""'
    if ca_pem:
        ca = (f'ca_file="$state/coordinator-ca.pem"\n'
              f'printf \'%s\\n\' {shlex.quote(ca_pem)} > "$ca_file" || {{ say "cannot write $ca_file"; exit 1; }}\n'
              'export ANEX_CA_FILE="$ca_file"')
    exports = "\n".join(f"export {name}={shlex.quote(value)}" for name, value in (env or {}).items()
                        if name not in ("ANEX_JOIN_TOKEN", "ANEX_JOIN_TOKEN_FILE", "ANEX_COORDINATOR_URL"))
    replacements = {
        "@COORDINATOR@": shlex.quote(coordinator_url.rstrip("/")),
        "@SHA256@": _hash_choice(hashes),
        "@STATE@": shlex.quote(state_dir),
        "@SECRET@": shlex.quote(secret),
        "@AGENT_PATH@": AGENT_PATH,
        "@CA@": ca,
        "@EXPORTS@": exports,
        "@COMMAND@": " ".join(shlex.quote(arg) for arg in command),
    }
    return re.sub("|".join(map(re.escape, replacements)), lambda m: replacements[m.group(0)], _SCRIPT)


def _hash_choice(hashes: dict[str, str]) -> str:
    """Shell lines setting ``sha256`` for ``$arch`` (one hash for any machine, or a ``case``)."""
    if "*" in hashes:
        return f"sha256={hashes['*']}"
    arms = "".join(f"    {arch}) sha256={digest} ;;\n" for arch, digest in sorted(hashes.items()))
    return (f"case $arch in\n{arms}"
            '    *) printf \'anex-agent bootstrap: no agent for architecture %s\\n\' "$arch" >&2; exit 1 ;;\nesac')


__all__ = ["BootCredentials", "MIGRATION", "PROVISION_LABEL", "agent_url", "boot_env", "issue", "node_of_provision",
           "start_script"]
