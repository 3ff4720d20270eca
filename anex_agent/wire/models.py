"""Wire models shared by the coordinator and its clients (agent, gateway, cluster).

One set of pydantic models for both sides, like tailscale's ``tailcfg``: the
coordinator validates requests with them and serialises responses with them; the
client in :mod:`anex_agent.client.rest` parses responses with the same classes. A change
here is a change of the REST contract and of ``/v1/openapi.json``.

Conventions:
* keys are WireGuard base64 public keys (44 characters); private keys never appear here;
* times are RFC 3339 UTC datetimes; durations are seconds;
* addresses are plain IPv4/IPv6 strings, networks are CIDR strings;
* every config-carrying document has a ``version``: a monotonically increasing integer
  of the coordinator's change log, used by the watch stream to resync.

Routes (see the coordinator's OpenAPI document for the authoritative list):
    POST   /v1/join-tokens                admin      JoinTokenCreate -> JoinTokenCreated
    GET    /v1/join-tokens                admin      -> JoinTokenList
    DELETE /v1/join-tokens/{id}           admin      -> 204 (revoke)
    POST   /v1/nodes                      join token NodeJoinRequest -> NodeJoinResponse
    GET    /v1/nodes                      admin      -> NodeList
    GET    /v1/nodes/{id}                 admin      -> NodeView
    DELETE /v1/nodes/{id}                 admin      -> 204
    POST   /v1/nodes/{id}/heartbeat       node       Heartbeat -> HeartbeatAck
    GET    /v1/nodes/{id}/config          node/admin -> NodeConfig
    PUT    /v1/nodes/{id}/tunnels         admin      TunnelsUpdate -> NodeConfig
    GET    /v1/nodes/{id}/telemetry       node/admin -> NodeTelemetry
    POST   /v1/nodes/{id}/access-token    admin      -> AgentAccessToken (cluster -> agent API)
    POST   /v1/gateways                   gw token   GatewayRegisterRequest -> GatewayRegisterResponse
    GET    /v1/gateways                   admin      -> GatewayList
    DELETE /v1/gateways/{id}              admin      -> 204
    GET    /v1/gateways/{id}/peers        gateway    -> PeerSet
    POST   /v1/gateways/{id}/credential   gateway    -> CredentialRenewal (rotation)
    GET    /v1/coordinator                public     -> CoordinatorInfo (key for join proofs)
    GET    /v1/watch                      node/gw    WebSocket of WatchEvent
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from datetime import datetime
from enum import Enum
from types import UnionType
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import (
    AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_serializer, field_validator,
)

from anex_agent import parse
from anex_agent.telemetry import bounds as telemetry_bounds
from anex_agent.wire.route_policy import DEFAULT_GATEWAY_ROUTES
from anex_agent.telemetry.models import Telemetry


# ---------------------------------------------------------------- limits (documented in the OpenAPI schema)

NAME_MAX = 253  # node and gateway names, host names (a DNS name)
SECRET_MAX = 512  # join tokens and credentials as sent
SHORT_TEXT_MAX = 128  # engine, path, agent version, capability names
PATH_REASON_MAX = 512  # TransportStatus.path_reason
URL_MAX = 2048
LABEL_KEY_MAX = 253
LABEL_VALUE_MAX = 253
LABELS_MAX = 64  # labels per token
LIST_MAX = 256  # list items of request fields (networks, tunnels, capabilities)
FREE_TEXT_MAX = 4096  # any string parsed from JSON without a smaller limit (also inside facts.detect, telemetry)
PUBLIC_KEY_PATTERN = r"^[A-Za-z0-9+/]{43}=$"  # 32 bytes of standard base64
CIDR_PATTERN = r"^[0-9A-Fa-f:.]+(/[0-9]{1,3})?$"  # the exact check is anex_agent.parse.cidr
WS_URL_PATTERN = r"^wss?://[^\s]+$"

# counters and measures in telemetry that cannot be negative: keys ending so (see anex_agent.gpu)
_NON_NEGATIVE_SUFFIXES = ("_bytes", "_count", "_errors", "_pct", "_mhz", "_w", "_seconds", "_bits", "_gbps")
# the longest string (and key) a telemetry block may hold: the tighter of the two rules
_TELEMETRY_STRING_MAX = min(FREE_TEXT_MAX, telemetry_bounds.MAX_STRING)


def _check_public_key(value: str) -> str:
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("must be a WireGuard public key: 44 characters of base64 (32 bytes)") from None
    if len(raw) != 32:
        raise ValueError(f"decodes to {len(raw)} bytes; a WireGuard public key is 32 bytes (44 base64 characters)")
    return value


def _check_cidr(value: str) -> str:
    return parse.cidr_text(value)


def _check_host_port(value: str) -> str:
    parse.host_port(value)
    return value


def _check_dns_server(value: str) -> str:
    parse.ip_port(value, default_port=53)
    return value


def _free_value(value: Any, path: str) -> None:
    """Refuse what no field of the REST contract may hold, at any depth of ``value``:
    NUL characters (PostgreSQL text cannot store them), strings longer than
    :data:`FREE_TEXT_MAX`, and NaN or infinite numbers (JSON has none).
    The message starts with the path inside ``value`` (``gpus.0.power_w: ...``)."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(_at(path, "must not contain the NUL character"))
        if len(value) > FREE_TEXT_MAX:
            raise ValueError(_at(path, f"must be at most {FREE_TEXT_MAX} characters"))
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(_at(path, "must be a finite number"))
    elif isinstance(value, dict):
        for key, item in value.items():
            _free_value(key, path)
            _free_value(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _free_value(item, f"{path}.{index}" if path else str(index))


def _at(path: str, message: str) -> str:
    return f"{path}: {message}" if path else message


def check_telemetry(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """Telemetry is free-form except: finite numbers, and counters/measures (keys ending in
    ``_bytes``, ``_count``, ``_errors``, ``_pct``, ... and the values of ``xid_counts``) not negative."""
    if value is not None:
        _free_value(value, "")
        _check_non_negative(value, "")
    return value


def _raw_telemetry(value: Any) -> Any:
    """The generic rules on the block as received, before it is read as :class:`Telemetry`
    (they also hold for keys the model does not know): :func:`check_telemetry`, then
    :func:`anex_agent.telemetry.bounds.check`. A built :class:`Telemetry` is checked as its dict.

    Every heartbeat carries a block (an 8-GPU one is about 600 values), so the common case
    is one pass of :func:`_telemetry_fine`; only a block it does not pass is walked by
    those checks, which name what is wrong."""
    if isinstance(value, Telemetry):
        value = value.as_sent()
    if isinstance(value, dict) and not _telemetry_fine(value, "", 0):
        telemetry_bounds.check(check_telemetry(value))
    return value


def _telemetry_fine(block: dict, key: str, depth: int) -> bool:
    """Whether the object ``block`` (under ``key``, ``depth`` levels down) keeps every rule of
    :func:`check_telemetry` and :func:`anex_agent.telemetry.bounds.check`, in one pass that
    builds no path. True only when both would pass; False where one would raise, and for any
    value that is not of a JSON type (the exact checks then decide)."""
    if depth > telemetry_bounds.MAX_DEPTH or len(block) > telemetry_bounds.MAX_KEYS:
        return False
    counts = key.endswith("xid_counts")  # its values are counts, whatever their keys
    string_ok = depth < telemetry_bounds.MAX_DEPTH  # a string is one level further down
    for name, item in block.items():
        if type(name) is not str or len(name) > _TELEMETRY_STRING_MAX or "\x00" in name:
            return False
        kind = type(item)
        if kind is str:
            if not string_ok or len(item) > _TELEMETRY_STRING_MAX or "\x00" in item:
                return False
        elif kind is int or kind is float:
            if item < 0 and (counts or name.endswith(_NON_NEGATIVE_SUFFIXES)):
                return False
            if kind is float and not math.isfinite(item):
                return False
        elif kind is dict:
            if not _telemetry_fine(item, name, depth + 1):
                return False
        elif kind is list:
            if not _telemetry_items_fine(item, name, depth + 1):
                return False
        elif kind is not bool and item is not None:
            return False
    return True


def _telemetry_items_fine(items: list, key: str, depth: int) -> bool:
    """:func:`_telemetry_fine` for a list (numbers in a list are readings: any finite value)."""
    if depth > telemetry_bounds.MAX_DEPTH or len(items) > (
            telemetry_bounds.MAX_GPUS if key == "gpus" else telemetry_bounds.MAX_LIST):
        return False
    string_ok = depth < telemetry_bounds.MAX_DEPTH
    for item in items:
        kind = type(item)
        if kind is str:
            if not string_ok or len(item) > _TELEMETRY_STRING_MAX or "\x00" in item:
                return False
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif kind is dict:
            if not _telemetry_fine(item, "", depth + 1):
                return False
        elif kind is list:
            if not _telemetry_items_fine(item, "", depth + 1):
                return False
        elif kind is not int and kind is not bool and item is not None:
            return False
    return True


def parse_telemetry(value: dict[str, Any] | Telemetry | None) -> Telemetry | None:
    """A telemetry block as the coordinator reads ``Heartbeat.telemetry`` (through JSON, in
    strict mode), or ``ValueError`` (``TypeError`` for a value JSON cannot hold) saying what is wrong."""
    if value is None:
        return None
    return Telemetry.model_validate_json(json.dumps(_raw_telemetry(value)), strict=True)


def _check_non_negative(value: Any, path: str) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(item, (int, float)) and not isinstance(item, bool) and item < 0 and (
                str(key).endswith(_NON_NEGATIVE_SUFFIXES) or path.endswith("xid_counts")
            ):
                raise ValueError(_at(where, "must not be negative"))
            _check_non_negative(item, where)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_non_negative(item, f"{path}.{index}" if path else str(index))


PublicKey = Annotated[
    str,
    Field(min_length=44, max_length=44, pattern=PUBLIC_KEY_PATTERN,
          description="WireGuard public key: 44 characters of base64 (32 bytes)"),
    AfterValidator(_check_public_key),
]
Cidr = Annotated[
    str,
    Field(max_length=parse.CIDR_MAX, pattern=CIDR_PATTERN, description="an IPv4 or IPv6 network in CIDR form"),
    AfterValidator(_check_cidr),
]
HostPort = Annotated[
    str,
    Field(max_length=parse.HOST_PORT_MAX, pattern=parse.HOST_PORT_PATTERN,
          description="HOST:PORT, port 1..65535 in ASCII digits; IPv6 hosts in brackets"),
    AfterValidator(_check_host_port),
]
DnsServerAddress = Annotated[
    str,
    Field(max_length=parse.HOST_PORT_MAX,
          description="a DNS server: IP, IP:PORT, IPv6 or [IPv6]:PORT (port 53 when none), port in ASCII digits"),
    AfterValidator(_check_dns_server),
]
Port = Annotated[int, Field(ge=1, le=65535)]
Name = Annotated[str, Field(min_length=1, max_length=NAME_MAX)]
Secret = Annotated[str, Field(min_length=1, max_length=SECRET_MAX)]
ShortText = Annotated[str, Field(max_length=SHORT_TEXT_MAX)]
WsUrl = Annotated[str, Field(max_length=URL_MAX, pattern=WS_URL_PATTERN)]
Labels = Annotated[
    dict[Annotated[str, Field(min_length=1, max_length=LABEL_KEY_MAX)],
         Annotated[str, Field(max_length=LABEL_VALUE_MAX)]],
    Field(max_length=LABELS_MAX),
]
Version = Annotated[int, Field(ge=0)]
Counter = Annotated[int, Field(ge=0)]


class Model(BaseModel):
    """Base of every wire model.

    * unknown fields are rejected (a typo is an error, not silently ignored);
    * in what is parsed from JSON (a request on the coordinator, an answer on a client), no
      string anywhere (fields, list items, dict keys, untyped objects) holds a NUL character,
      and untyped objects hold no NaN/Infinity and no string over :data:`FREE_TEXT_MAX`
      characters (422 naming the field). Models built in Python by the product's own code
      are not walked (a coordinator answer never fails on them);
    * NaN and Infinity are refused in float fields.

    The coordinator parses request bodies in pydantic's strict mode (``"reusable": 0``
    or ``"port": "80"`` are errors, not coerced); clients read answers with :func:`read`
    (lax mode, fields they do not know dropped at every depth): a coordinator newer than its
    agents and gateways may add fields to what it sends without breaking them (upgrade the
    coordinator first; it accepts what older clients send).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul_or_non_finite(cls, value: Any, info: ValidationInfo) -> Any:
        if info.mode == "json" and not isinstance(value, BaseModel):
            _free_value(value, "")
        return value


class Provider(str, Enum):
    vastai = "vastai"
    runpod = "runpod"
    onprem = "onprem"
    other = "other"


class TokenKind(str, Enum):
    node = "node"
    gateway = "gateway"


class NodeState(str, Enum):
    """pending (joined, no heartbeat yet) -> ready -> not_ready (missed heartbeats) -> expired."""

    pending = "pending"
    ready = "ready"
    not_ready = "not_ready"
    expired = "expired"


class Health(str, Enum):
    healthy = "healthy"
    degraded = "degraded"
    unhealthy = "unhealthy"
    unknown = "unknown"


# ---------------------------------------------------------------- join tokens


class JoinTokenCreate(Model):
    """A new join token. Uses: ``max_uses`` when given; else 1 (single-use), or no limit with
    ``reusable: true``. ``providers`` (node tokens only): the providers a joining node may name."""

    kind: TokenKind = TokenKind.node
    reusable: bool = Field(False, description="true without max_uses: no limit on uses")
    max_uses: int | None = Field(None, ge=1, le=1_000_000, description="nodes/gateways the token may admit; default 1")
    expires_in: int = Field(3600, ge=1, le=365 * 86400, description="seconds until the token expires")
    labels: Labels = Field(default_factory=dict)
    providers: list[Provider] | None = Field(
        None, min_length=1, description="node tokens: a join naming another provider is refused (403); null = any"
    )


class JoinTokenCreated(Model):
    id: str
    token: str = Field(description="the secret; shown once, stored only hashed")
    kind: TokenKind
    reusable: bool
    expires_at: datetime
    labels: dict[str, str]
    max_uses: int | None = Field(None, description="null = no limit")
    providers: list[Provider] | None = None


class JoinTokenView(Model):
    """A join token as the admin sees it later: never the secret."""

    id: str
    kind: TokenKind
    reusable: bool = Field(description="true when the token admits more than one node or gateway")
    labels: dict[str, str]
    created_at: datetime
    expires_at: datetime
    used_at: datetime | None = None
    used_by: str | None = Field(None, description="the first node or gateway that used the token")
    use_count: int = Field(0, description="joins with the token, re-joins included")
    uses: int = Field(0, description="distinct nodes/gateways the token admitted (counted against max_uses)")
    max_uses: int | None = Field(None, description="null = no limit")
    providers: list[Provider] | None = None


class JoinTokenList(Model):
    tokens: list[JoinTokenView]


# ---------------------------------------------------------------- proof of key possession


class KeyProof(Model):
    """Proves the caller holds the private key of the ``public_key`` it names (see :mod:`anex_agent.wire.proof`)."""

    timestamp: int = Field(ge=0, description="seconds since the epoch; within 120 s of the coordinator's clock")
    nonce: str = Field(min_length=16, max_length=64, pattern=r"^[A-Za-z0-9_-]+$", description="random, never reused")
    mac: str = Field(min_length=44, max_length=44, description="base64 HMAC-SHA256 (docs/coordinator.md)")


class CoordinatorInfo(Model):
    """``GET /v1/coordinator`` (no authentication): what a node needs before it joins."""

    public_key: PublicKey = Field(description="the coordinator's X25519 public key, for join proofs")


class CredentialRenewal(Model):
    """``POST /v1/gateways/{id}/credential``: the gateway's new credential (the old one ends after a grace)."""

    credential: str
    rotate_in: float = Field(description="seconds until the gateway should renew again")


# ---------------------------------------------------------------- node join


class NodeFacts(Model):
    hostname: str = Field("", max_length=NAME_MAX)
    capabilities: list[ShortText] = Field(default_factory=list, max_length=LIST_MAX,
                                          description="e.g. kernel-wireguard, wireguard-go, udp")
    detect: dict[str, Any] = Field(default_factory=dict, description="the agent's detect report")
    agent_version: ShortText = ""
    api_port: int = Field(9555, ge=1, le=65535, description="the port of the agent API at the node's mesh address")
    ssh_port: int = Field(0, ge=0, le=65535, description="the port of the node's SSH server at its mesh address; 0: none")


class NodeJoinRequest(Model):
    token: Secret
    public_key: PublicKey
    name: Name
    provider: Provider
    facts: NodeFacts = Field(default_factory=NodeFacts)
    proof: KeyProof | None = Field(None, description="proof of possession of public_key's private key (required)")


class GatewayPeer(Model):
    """How a node reaches one gateway."""

    id: str
    public_key: PublicKey
    endpoint: str | None = Field(None, max_length=URL_MAX, description="UDP HOST:PORT of the gateway's WireGuard hub")
    ws_url: str | None = Field(None, max_length=URL_MAX,
                               description="WebSocket relay URL (ws:// or wss://) for UDP-blocked nodes")
    allowed_ips: list[Cidr]
    persistent_keepalive: int = Field(25, ge=0, le=65535)
    mesh_address: str


class TunnelSpec(Model):
    """A TCP forward on the node: 127.0.0.1:<listen_port> -> <target> over the mesh (GW_TUNNEL_<port>)."""

    listen_port: Port
    target: HostPort


class NodeConfig(Model):
    """Everything a node needs to run its data plane. ``version`` orders changes."""

    node_id: str
    version: int
    address: str
    network: Cidr
    mtu: int = Field(ge=1280, le=9000)
    dns: list[DnsServerAddress]
    search_domains: list[str] = Field(default_factory=list)
    gateways: list[GatewayPeer]
    tunnels: list[TunnelSpec] = Field(default_factory=list)
    agent_api_verify_key: str = Field(
        "", description="Ed25519 public key (base64) that signs cluster access tokens for the agent API"
    )
    gateway_routes: list[Cidr] = Field(
        default_factory=lambda: list(DEFAULT_GATEWAY_ROUTES),
        description="networks gateways may offer (the coordinator's --gateway-route); the node installs a gateway's "
        "network only inside one of them, and never one covering the coordinator's address or a gateway's endpoint",
    )


class NodeJoinResponse(Model):
    node_id: str
    credential: str = Field(description="bearer credential of this node; shown once, stored only hashed")
    config: NodeConfig


# ---------------------------------------------------------------- heartbeats


class ContainerState(Model):
    """The workload's state as Kubernetes reports a container's (``anex-agent run`` only)."""

    state: Literal["waiting", "running", "terminated"]
    reason: ShortText = Field("", description="waiting: ContainerCreating, or CrashLoopBackOff (its restart "
                              "policy starts it again; the other fields tell its last run); terminated: Completed, "
                              "Error or OOMKilled")
    exit_code: int | None = Field(None, ge=0, le=255, description="terminated (or CrashLoopBackOff: the last run): "
                                  "the shell-style status (128+N for signal N)")
    signal: int | None = Field(None, ge=1, le=64, description="terminated: the signal that ended it, if one did")
    started_at: datetime | None = None
    finished_at: datetime | None = None
    restart_count: Counter = 0
    ready: bool | None = Field(None, description="running: whether its readiness probe passes (True without one, once "
                               "started); None: the agent runs no probes (read: ready while running)")
    started: bool | None = Field(None, description="running: whether its startup probe passed (True without one); "
                                 "None: the agent runs no probes")
    probe_failures: Counter = Field(0, description="how many times a probe decided against the workload so far "
                                    "(a readiness probe unready, a liveness or startup probe stopping it), all runs")
    probe_message: ShortText = Field("", description="the last such decision, e.g. 'Liveness probe failed: ...'")


class TransportStatus(Model):
    engine: ShortText = ""
    path: ShortText = ""
    path_reason: str = Field("", max_length=PATH_REASON_MAX, description="why the node is on this path (udp|websocket), or has none (none)")
    last_handshake_age: float | None = Field(None, ge=0, description="seconds since the last handshake, None if never")
    rx_bytes: Counter = 0
    tx_bytes: Counter = 0
    dead_peer: str = Field("", max_length=PATH_REASON_MAX,
                           description="the last dead-peer detection: when, why a fresh handshake was started, outcome")
    workload: ContainerState | None = Field(None, description="the workload of `anex-agent run`; None for `daemon`")


class Heartbeat(Model):
    status: TransportStatus = Field(default_factory=TransportStatus)
    config_version: Version = 0
    telemetry: Annotated[Telemetry | None, BeforeValidator(_raw_telemetry)] = Field(
        None,
        description=(
            "the node's GPU and host telemetry (anex_agent.telemetry.models, docs/telemetry.md); the coordinator "
            "takes the node's health from telemetry['health'] and stores the block as sent. Keys this "
            "version does not know are kept. Bounded by anex_agent.telemetry.bounds (64 GPUs, 256 list "
            "items and keys, nesting 8). Numbers are finite; counters and "
            "measures (keys ending in _bytes, _count, _errors, _pct, _mhz, _w, _seconds, _bits, _gbps, and "
            "the values of xid_counts) are not negative; strings hold at most 4096 characters and no NUL"
        ),
    )

    @field_serializer("telemetry")
    def _telemetry_as_sent(self, value: Telemetry | None) -> dict[str, Any] | None:
        return None if value is None else value.as_sent()


class HeartbeatAck(Model):
    state: NodeState
    config_version: int = Field(description="the coordinator's current config version for this node")
    next_heartbeat_in: float = Field(description="seconds until the coordinator expects the next heartbeat")
    credential: str | None = Field(
        None, description="a new credential for this node (rotation); the one used for this call ends after a grace"
    )


# ---------------------------------------------------------------- admin views


class NodeView(Model):
    id: str
    name: str
    provider: Provider
    public_key: PublicKey
    address: str
    state: NodeState
    health: Health = Health.unknown
    health_reasons: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    facts: NodeFacts = Field(default_factory=NodeFacts)
    status: TransportStatus | None = None
    created_at: datetime
    last_heartbeat_at: datetime | None = None
    tunnels: list[TunnelSpec] = Field(default_factory=list)


class NodeList(Model):
    nodes: list[NodeView]


class NodeTelemetry(Model):
    """``GET /v1/nodes/{id}/telemetry``: the latest telemetry payload the node sent, as it sent it.

    The JSON form of :class:`anex_agent.telemetry.models.Telemetry` (validated when it arrived); served
    as an object so that a block stored by an older coordinator is still served as it is."""

    node_id: str
    received_at: datetime | None = None
    telemetry: dict[str, Any] | None = None


class TunnelsUpdate(Model):
    tunnels: list[TunnelSpec] = Field(max_length=LIST_MAX)


class AgentAccessToken(Model):
    token: str = Field(description="signed, short-lived bearer token the cluster presents to the node's agent API; good for one call (the agent refuses a second use)")
    expires_at: datetime


# ---------------------------------------------------------------- gateways


class GatewayRegisterRequest(Model):
    token: Secret
    public_key: PublicKey
    name: Name
    endpoint: HostPort | None = Field(None, description="UDP HOST:PORT nodes use to reach the hub")
    ws_url: WsUrl | None = Field(None, description="WebSocket relay URL (ws:// or wss://)")
    routes: list[Cidr] = Field(default_factory=list, max_length=LIST_MAX,
                               description="cluster networks reachable through this gateway")
    proof: KeyProof | None = Field(None, description="proof of possession of public_key's private key (required)")


class MeshPeer(Model):
    """A peer a gateway must serve: one node."""

    node_id: str
    name: str
    public_key: PublicKey
    allowed_ips: list[Cidr]


class PeerSet(Model):
    version: int
    peers: list[MeshPeer]


class GatewayRegisterResponse(Model):
    gateway_id: str
    credential: str = Field(description="bearer credential of this gateway; shown once, stored only hashed")
    address: str = Field(description="the gateway's mesh address (also the nodes' DNS server)")
    network: Cidr
    mtu: int
    peers: PeerSet
    credential_rotation: float = Field(3600.0, description="renew the credential this often (POST .../credential)")


class GatewayView(Model):
    id: str
    name: str
    public_key: PublicKey
    address: str
    endpoint: str | None
    ws_url: str | None
    routes: list[Cidr]
    created_at: datetime
    last_seen_at: datetime | None = None
    gone_at: datetime | None = Field(None, description="when it stopped or was found silent; nodes leave it "
                                                       "out until it is back (None: present)")
    gone_reason: str | None = None


class GatewayList(Model):
    gateways: list[GatewayView]


# ---------------------------------------------------------------- watch stream


class SshRevocation(Model):
    """An SSH user certificate the node must refuse from now on (until it expires anyway)."""

    serial: int = Field(ge=1)
    valid_before: float = Field(description="when the certificate expires (seconds since the epoch)")


class WatchEvent(Model):
    """One message on ``GET /v1/watch`` (JSON text frames).

    The client connects with ``?since=<version>`` (0 for none). The server first
    sends a ``snapshot`` when ``since`` is older than what it can replay, else the
    missed events in order; then live events. Types:

    * ``snapshot`` -- gateways: ``peers`` is the full set; nodes: ``config`` is the full config;
    * ``peer_added`` / ``peer_removed`` -- gateways only, one ``peer``;
    * ``config`` -- nodes only, the node's new full config;
    * ``gateway_changed`` -- nodes only: gateways changed, ``config`` holds the new full config;
    * ``ssh_revoked`` -- nodes only: an SSH user certificate for this node was revoked
      (``ssh_revoked``); a resumed stream replays those after ``since`` (docs/remote-access.md).
    """

    type: Literal["snapshot", "peer_added", "peer_removed", "config", "gateway_changed", "ssh_revoked"]
    version: int
    peers: list[MeshPeer] | None = None
    peer: MeshPeer | None = None
    config: NodeConfig | None = None
    ssh_revoked: SshRevocation | None = None


# ---------------------------------------------------------------- errors


class Problem(BaseModel):
    """RFC 9457 problem details (``application/problem+json``).

    ``errors`` lists field-level problems: ``{"field": "public_key", "message": "..."}``.
    """

    model_config = ConfigDict(extra="allow")

    type: str = "about:blank"
    title: str
    status: int
    detail: str = ""
    instance: str | None = None
    errors: list[dict[str, str]] = Field(default_factory=list)


# ---------------------------------------------------------------- reading answers (clients)

M = TypeVar("M", bound=BaseModel)


def read(model: type[M], raw: str | bytes | Any) -> M:
    """``model`` from an answer of the coordinator (JSON text, or the object already decoded),
    ignoring fields this version does not know, at any depth, so that a newer coordinator can
    add fields; everything known is validated as usual (lax mode, as clients parse)."""
    data = json.loads(raw) if isinstance(raw, (str, bytes, bytearray)) else raw
    return model.model_validate(_known_only(model, data))


Strip = Callable[[Any], Any]
_MODEL_STRIPS: dict[type[BaseModel], Strip | None] = {}


def _known_only(model: type[BaseModel], data: Any) -> Any:
    strip = _model_strip(model)
    return data if strip is None else strip(data)


def _model_strip(model: type[BaseModel]) -> Strip | None:
    """What drops ``model``'s unknown fields from a decoded object, at any depth (None: nothing
    to drop: the model takes extra fields itself). Worked out once per model from its field
    types, so a 10,000-peer answer costs one key check per object, not a walk of the types."""
    if model in _MODEL_STRIPS:
        found = _MODEL_STRIPS[model]
        # a model whose fields refer back to it: decided when the outer call returns
        return found if found is not None else (lambda data: (_MODEL_STRIPS[model] or _same)(data))
    if model.model_config.get("extra") != "forbid":
        _MODEL_STRIPS[model] = None
        return None
    _MODEL_STRIPS[model] = None  # while its fields are looked at
    known = frozenset(model.model_fields)
    nested = {name: strip for name, field in model.model_fields.items()
              if (strip := _value_strip(field.annotation)) is not None}

    def strip(data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if not nested:
            return data if data.keys() <= known else {k: v for k, v in data.items() if k in known}
        return {key: (nested[key](value) if key in nested else value)
                for key, value in data.items() if key in known}

    _MODEL_STRIPS[model] = strip
    return strip


def _same(value: Any) -> Any:
    return value


def _value_strip(annotation: Any) -> Strip | None:
    """What drops unknown fields from a value of type ``annotation`` (None: nothing can hold any)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _model_strip(annotation)
    if origin is Annotated:
        return _value_strip(args[0])
    if origin in (Union, UnionType):
        # the member that fits the value's shape: the first model for an object, the first list for a list
        for_dict = next((_model_strip(arg) for arg in args if isinstance(arg, type) and issubclass(arg, BaseModel)),
                        None)
        for_list = next((_value_strip(arg) for arg in args if get_origin(arg) in (list, tuple)), None)
        if for_dict is None and for_list is None:
            return None
        return lambda value: (for_dict(value) if for_dict is not None and isinstance(value, dict) else
                              for_list(value) if for_list is not None and isinstance(value, list) else value)
    if origin in (list, tuple) and args:
        item = _value_strip(args[0])
        if item is None:
            return None
        return lambda value: [item(x) for x in value] if isinstance(value, list) else value
    if origin is dict and len(args) == 2:
        item = _value_strip(args[1])
        if item is None:
            return None
        return lambda value: {k: item(x) for k, x in value.items()} if isinstance(value, dict) else value
    return None
