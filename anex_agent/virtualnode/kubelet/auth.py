"""Who may use the kubelet port, decided as a kubelet decides it.

* **Authentication**: a client certificate the TLS handshake verified against the cluster's
  client CA (``--kubelet-client-ca-file``: the CA of the API server's kubelet client
  certificate; the handshake refuses a certificate from any other CA) gives the user its CN and
  groups its Os; else ``Authorization: Bearer <token>`` is asked of the API server
  (TokenReview). Both add ``system:authenticated``. Anything else: 401 ``Unauthorized``
  (anonymous requests are refused).
* **Authorization**: every request is asked of the API server (SubjectAccessReview) with the
  kubelet's attributes (:mod:`.authmap`): ``verb`` on ``nodes/<subresource>`` of this Node; any
  allowed subresource lets it through, else 403 ``Forbidden (user=..., verb=..., ...)``. A review
  that fails (the API server unreachable) is a 500 and is not cached.
* **Caches**, as the kubelet's webhook defaults: token reviews 2 minutes (keyed on the token's
  SHA-256, never the token), allowed access reviews 5 minutes, denied ones 30 seconds; each
  holds at most :data:`CACHE_MAX` entries (the oldest go first).
* **Token reviews are rate-limited** (:class:`ReviewBudget`): anyone who reaches the port can
  send a new made-up token with each request, and each would cost the API server a TokenReview.
  A token not in the cache is reviewed only while its client address has a token of its bucket
  (:data:`REVIEW_RATE` a second, bursts of :data:`REVIEW_BURST`) and all addresses together have
  one (:data:`REVIEW_RATE_ALL`, :data:`REVIEW_BURST_ALL`); else the request is answered 429 with
  ``Retry-After``, nothing asked of the API server. Cached tokens and client certificates (the API
  server's own requests) are never held back. Refusals are logged at most 10 times a minute.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web

from anex_agent.errors import KubeError
from anex_agent.net.peer_log import LogBudget, peer_text
from anex_agent.virtualnode.kubelet import authmap
from anex_agent.virtualnode.kubelet.context import User

log = logging.getLogger(__name__)

AUTHENTICATED = "system:authenticated"
TOKEN_TTL = 120.0
ALLOWED_TTL = 300.0
DENIED_TTL = 30.0
CACHE_MAX = 4096
REVIEW_RATE = 5.0  # token reviews a second for tokens not in the cache, per client address
REVIEW_BURST = 20
REVIEW_RATE_ALL = 50.0  # the same, all client addresses together
REVIEW_BURST_ALL = 100
RETRY_AFTER = 1  # seconds, in the 429 answer


class Reviews(Protocol):
    async def token_review(self, token: str) -> User | None:
        """The token's user, None when the API server says it is not authenticated; KubeError."""
        ...

    async def access_review(self, user: User, attrs: authmap.Attributes) -> tuple[bool, str]:
        """(allowed, the API server's reason); KubeError."""
        ...


class TtlCache:
    """A bounded map whose entries expire ``ttl`` seconds (given per entry) after they were put."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, maximum: int = CACHE_MAX) -> None:
        self.clock = clock
        self.maximum = maximum
        self._items: OrderedDict[Any, tuple[float, Any]] = OrderedDict()

    def get(self, key: Any) -> Any:
        hit = self._items.get(key)
        if hit is None:
            return None
        if hit[0] <= self.clock():
            del self._items[key]
            return None
        return hit[1]

    def put(self, key: Any, value: Any, ttl: float) -> None:
        self._items[key] = (self.clock() + ttl, value)
        self._items.move_to_end(key)
        while len(self._items) > self.maximum:
            self._items.popitem(last=False)


class ReviewBudget:
    """Token buckets for token reviews: one per client address (at most :data:`CACHE_MAX`, the
    least recently used forgotten first, and any that has filled up again) and one for all."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, *, rate: float = REVIEW_RATE,
                 burst: float = REVIEW_BURST, rate_all: float = REVIEW_RATE_ALL, burst_all: float = REVIEW_BURST_ALL,
                 maximum: int = CACHE_MAX) -> None:
        self.clock, self.rate, self.burst, self.maximum = clock, rate, burst, maximum
        self.rate_all, self.burst_all = rate_all, burst_all
        self._sources: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address -> (tokens, when)
        self._all = (float(burst_all), clock())

    @staticmethod
    def _refill(bucket: tuple[float, float], rate: float, burst: float, now: float) -> float:
        tokens, when = bucket
        return min(float(burst), tokens + max(0.0, now - when) * rate)

    def allow(self, source: str) -> bool:
        """Take one review for ``source`` (and one of all); False when either bucket is empty."""
        now = self.clock()
        mine = self._refill(self._sources.pop(source, (float(self.burst), now)), self.rate, self.burst, now)
        everyone = self._refill(self._all, self.rate_all, self.burst_all, now)
        allowed = mine >= 1.0 and everyone >= 1.0
        if allowed:
            mine, everyone = mine - 1.0, everyone - 1.0
        self._all = (everyone, now)
        self._sources[source] = (mine, now)
        while len(self._sources) > self.maximum:
            self._sources.popitem(last=False)
        oldest = next(iter(self._sources.items()), None)
        while oldest is not None and self._refill(oldest[1], self.rate, self.burst, now) >= self.burst:
            del self._sources[oldest[0]]  # full again: the same as no bucket at all
            oldest = next(iter(self._sources.items()), None)
        return allowed

    def __len__(self) -> int:
        return len(self._sources)


def user_from_peercert(peercert: dict | None) -> User | None:
    """The user of a verified client certificate (``SSLSocket.getpeercert()``'s dict): CN, Os."""
    if not peercert:
        return None
    names: list[tuple[str, str]] = [pair for rdn in peercert.get("subject", ()) for pair in rdn]
    common = [value for key, value in names if key == "commonName"]
    if not common or not common[0]:
        return None
    groups = tuple(value for key, value in names if key == "organizationName")
    return User(common[0], (*groups, AUTHENTICATED))


def _text(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=message, content_type="text/plain")


class ClusterAuthorizer:
    """The :class:`~anex_agent.virtualnode.kubelet.context.Authorizer` of one Node (see the module docstring)."""

    def __init__(self, node_name: str, reviews: Reviews, clock: Callable[[], float] = time.monotonic) -> None:
        self.node_name = node_name
        self.reviews = reviews
        self.tokens = TtlCache(clock)
        self.decisions = TtlCache(clock)
        self.review_budget = ReviewBudget(clock)
        self._refusals_logged = LogBudget(clock=clock)

    async def authenticate(self, request: web.Request) -> User:
        transport = request.transport
        user = user_from_peercert(transport.get_extra_info("peercert") if transport is not None else None)
        if user is not None:
            return user
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and token:
            key = hashlib.sha256(token.encode()).hexdigest()
            cached = self.tokens.get(key)
            if cached is not None:
                user = cached or None
            else:
                source = getattr(request, "remote", None) or "-"
                if not self.review_budget.allow(source):
                    skipped = self._refusals_logged.take()
                    if skipped is not None:
                        log.warning("kubelet port: too many tokens to review from %s; answered 429%s",
                                    peer_text(source), f" ({skipped} more not logged)" if skipped else "")
                    raise web.HTTPTooManyRequests(text="Too many token reviews; try again later\n",
                                                  content_type="text/plain", headers={"Retry-After": str(RETRY_AFTER)})
                try:
                    user = await self.reviews.token_review(token)
                except KubeError as err:
                    log.warning("kubelet port: a token could not be reviewed: %s", err)
                    raise web.HTTPUnauthorized(text="Unauthorized", content_type="text/plain") from None
                self.tokens.put(key, user or False, TOKEN_TTL)
            if user is not None:
                return user if AUTHENTICATED in user.groups else User(user.name, (*user.groups, AUTHENTICATED),
                                                                     user.uid, user.extra)
        raise web.HTTPUnauthorized(text="Unauthorized", content_type="text/plain")

    async def authorize(self, user: User, method: str, path: str) -> None:
        attrs = authmap.attributes(method, path, self.node_name)
        for attr in attrs:
            key = (user.name, user.groups, user.uid, attr)
            allowed = self.decisions.get(key)
            if allowed is None:
                try:
                    allowed, reason = await self.reviews.access_review(user, attr)
                except KubeError as err:
                    log.warning("kubelet port: access of %s to nodes/%s could not be reviewed: %s",
                                user.name, attr.subresource, err)
                    raise web.HTTPInternalServerError(
                        text=f"Authorization error (user={user.name}, verb={attr.verb}, resource=nodes, "
                             f"subresource={attr.subresource})", content_type="text/plain") from None
                self.decisions.put(key, allowed, ALLOWED_TTL if allowed else DENIED_TTL)
            if allowed:
                return
        subs = " ".join(a.subresource for a in attrs)
        log.info("kubelet port: forbidden: %s %s %s", user.name, method, path)
        raise web.HTTPForbidden(text=f"Forbidden (user={user.name}, verb={attrs[0].verb}, resource=nodes, "
                                     f"subresource(s)=[{subs}])\n", content_type="text/plain")


class KubeReviews:
    """:class:`Reviews` through the API server (TokenReview, SubjectAccessReview; the ClusterRole
    ``system:auth-delegator`` grants both: deploy/rbac.yaml)."""

    def __init__(self, kube: Any) -> None:
        from kubernetes_asyncio import client

        self.kube = kube  # a virtualnode.kube.KubeApi
        self.authn = client.AuthenticationV1Api(kube.api_client)
        self.authz = client.AuthorizationV1Api(kube.api_client)

    async def token_review(self, token: str) -> User | None:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        doc = await self.kube._json("create", "tokenreviews", self.authn.create_token_review, body) or {}
        status = doc.get("status") or {}
        info = status.get("user") or {}
        if not status.get("authenticated") or not info.get("username"):
            return None
        return User(str(info["username"]), tuple(str(g) for g in info.get("groups") or ()), str(info.get("uid") or ""),
                    {str(k): [str(x) for x in v] for k, v in (info.get("extra") or {}).items()})

    async def access_review(self, user: User, attrs: authmap.Attributes) -> tuple[bool, str]:
        spec: dict[str, Any] = {"user": user.name, "groups": list(user.groups),
                                "resourceAttributes": {"verb": attrs.verb, "resource": "nodes", "version": "v1",
                                                       "group": "", "subresource": attrs.subresource,
                                                       "name": attrs.name}}
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = user.extra
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        doc = await self.kube._json("create", "subjectaccessreviews", self.authz.create_subject_access_review,
                                    body) or {}
        status = doc.get("status") or {}
        return bool(status.get("allowed")) and not status.get("denied"), str(status.get("reason") or "")
