"""The base of every wire model: :class:`Model`, the limits and the field types the contract shares.

One set of pydantic models for both sides, like tailscale's ``tailcfg``: the coordinator
validates requests with them and serialises responses with them; the client in
:mod:`anex_agent.client.rest` parses responses with the same classes (through the tolerant
reader, :mod:`anex_agent.wire.reader`). A change to a wire model is a change of the REST
contract and of ``/v1/openapi.json``.

Conventions:
* keys are WireGuard base64 public keys (44 characters); private keys never appear here;
* times are RFC 3339 UTC datetimes; durations are seconds;
* addresses are plain IPv4/IPv6 strings, networks are CIDR strings;
* every config-carrying document has a ``version``: a monotonically increasing integer
  of the coordinator's change log, used by the watch stream to resync.

:func:`check_free_value` is the rule no value parsed from JSON may break (no NUL, no string
over :data:`FREE_TEXT_MAX` characters, no NaN or infinity): :class:`Model` applies it to what it
parses, :mod:`anex_agent.wire.telemetry` to a telemetry block. :class:`Provider` is here
because join tokens and nodes both name it. Pure: imports :mod:`anex_agent.parse` and pydantic.
"""

from __future__ import annotations

import base64
import binascii
import math
from enum import Enum
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from anex_agent import parse


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


def check_free_value(value: Any, path: str) -> None:
    """Refuse what no field of the REST contract may hold, at any depth of ``value``:
    NUL characters (PostgreSQL text cannot store them), strings longer than
    :data:`FREE_TEXT_MAX`, and NaN or infinite numbers (JSON has none).
    The message starts with the path inside ``value`` (``gpus.0.power_w: ...``)."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(at_path(path, "must not contain the NUL character"))
        if len(value) > FREE_TEXT_MAX:
            raise ValueError(at_path(path, f"must be at most {FREE_TEXT_MAX} characters"))
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(at_path(path, "must be a finite number"))
    elif isinstance(value, dict):
        for key, item in value.items():
            check_free_value(key, path)
            check_free_value(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_free_value(item, f"{path}.{index}" if path else str(index))


def at_path(path: str, message: str) -> str:
    """``message`` about the value at ``path`` (``gpus.0.power_w: ...``; the bare message at the top)."""
    return f"{path}: {message}" if path else message


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
    or ``"port": "80"`` are errors, not coerced); clients read answers with
    :func:`anex_agent.wire.reader.read` (lax mode, fields they do not know dropped at every
    depth): a coordinator newer than its agents and gateways may add fields to what it sends
    without breaking them (upgrade the coordinator first; it accepts what older clients send).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul_or_non_finite(cls, value: Any, info: ValidationInfo) -> Any:
        if info.mode == "json" and not isinstance(value, BaseModel):
            check_free_value(value, "")
        return value


class Provider(str, Enum):
    vastai = "vastai"
    runpod = "runpod"
    onprem = "onprem"
    other = "other"
