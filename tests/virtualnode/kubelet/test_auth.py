"""ClusterAuthorizer: certificates, tokens through TokenReview, SubjectAccessReview and its caches."""

from types import SimpleNamespace

import pytest
from aiohttp import web

from anex_agent.errors import KubeError
from anex_agent.virtualnode.kubelet import auth, authmap
from anex_agent.virtualnode.kubelet.context import User


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class FakeReviews:
    def __init__(self, tokens=None, allowed=()):
        self.tokens = tokens or {}
        self.allowed = set(allowed)  # (user, subresource)
        self.token_calls = 0
        self.access_calls = []
        self.fail = False

    async def token_review(self, token):
        self.token_calls += 1
        if self.fail:
            raise KubeError("create tokenreviews: the API server did not answer")
        return self.tokens.get(token)

    async def access_review(self, user, attrs):
        self.access_calls.append((user.name, attrs))
        if self.fail:
            raise KubeError("create subjectaccessreviews: the API server did not answer")
        return (user.name, attrs.subresource) in self.allowed, ""


def request(peercert=None, headers=None):
    transport = SimpleNamespace(get_extra_info=lambda name: peercert if name == "peercert" else None)
    return SimpleNamespace(transport=transport, headers=headers or {})


CERT = {"subject": ((("organizationName", "system:masters"),), (("organizationName", "ops"),),
                    (("commonName", "kube-apiserver-kubelet-client"),))}


async def test_a_verified_client_certificate_gives_its_cn_and_os():
    authorizer = auth.ClusterAuthorizer("n", FakeReviews())
    user = await authorizer.authenticate(request(CERT))
    assert user.name == "kube-apiserver-kubelet-client"
    assert user.groups == ("system:masters", "ops", auth.AUTHENTICATED)


async def test_no_certificate_and_no_token_is_401():
    authorizer = auth.ClusterAuthorizer("n", FakeReviews())
    with pytest.raises(web.HTTPUnauthorized):
        await authorizer.authenticate(request())
    with pytest.raises(web.HTTPUnauthorized):
        await authorizer.authenticate(request(headers={"Authorization": "Basic dXNlcjpwYXNz"}))


async def test_a_token_is_reviewed_once_then_cached_for_two_minutes():
    clock = Clock()
    reviews = FakeReviews(tokens={"good": User("alice", ("dev",))})
    authorizer = auth.ClusterAuthorizer("n", reviews, clock)
    for _ in range(3):
        user = await authorizer.authenticate(request(headers={"Authorization": "Bearer good"}))
        assert user.name == "alice" and auth.AUTHENTICATED in user.groups
    assert reviews.token_calls == 1
    clock.now += auth.TOKEN_TTL + 1
    await authorizer.authenticate(request(headers={"Authorization": "Bearer good"}))
    assert reviews.token_calls == 2


async def test_a_refused_token_is_401_and_the_token_is_not_kept_in_the_cache():
    reviews = FakeReviews()
    authorizer = auth.ClusterAuthorizer("n", reviews)
    with pytest.raises(web.HTTPUnauthorized):
        await authorizer.authenticate(request(headers={"Authorization": "Bearer s3cret-token"}))
    assert all("s3cret-token" not in repr(key) for key in authorizer.tokens._items)


async def test_a_failed_token_review_is_401():
    reviews = FakeReviews()
    reviews.fail = True
    with pytest.raises(web.HTTPUnauthorized):
        await auth.ClusterAuthorizer("n", reviews).authenticate(request(headers={"Authorization": "Bearer x"}))


async def test_allowed_by_any_of_the_subresources():
    reviews = FakeReviews(allowed={("bob", "proxy")})
    authorizer = auth.ClusterAuthorizer("anex-vastai", reviews)
    await authorizer.authorize(User("bob"), "GET", "/pods")
    assert [a.subresource for _, a in reviews.access_calls] == ["pods", "proxy"]
    assert all(a.name == "anex-vastai" for _, a in reviews.access_calls)


async def test_denied_is_403_naming_user_verb_and_subresources():
    authorizer = auth.ClusterAuthorizer("n", FakeReviews(allowed={("bob", "proxy")}))
    with pytest.raises(web.HTTPForbidden) as caught:
        await authorizer.authorize(User("bob"), "GET", "/stats/summary")
    assert caught.value.text == "Forbidden (user=bob, verb=get, resource=nodes, subresource(s)=[stats])\n"


async def test_decisions_are_cached_five_minutes_when_allowed_and_thirty_seconds_when_denied():
    clock = Clock()
    reviews = FakeReviews(allowed={("bob", "proxy")})
    authorizer = auth.ClusterAuthorizer("n", reviews, clock)
    await authorizer.authorize(User("bob"), "POST", "/exec/ns/p/c")
    await authorizer.authorize(User("bob"), "POST", "/exec/ns/p/c")
    assert len(reviews.access_calls) == 1
    for _ in range(2):
        with pytest.raises(web.HTTPForbidden):
            await authorizer.authorize(User("eve"), "POST", "/exec/ns/p/c")
    assert len(reviews.access_calls) == 2
    clock.now += auth.DENIED_TTL + 1
    with pytest.raises(web.HTTPForbidden):
        await authorizer.authorize(User("eve"), "POST", "/exec/ns/p/c")
    await authorizer.authorize(User("bob"), "POST", "/exec/ns/p/c")
    assert len(reviews.access_calls) == 3  # eve asked again, bob still cached
    clock.now += auth.ALLOWED_TTL
    await authorizer.authorize(User("bob"), "POST", "/exec/ns/p/c")
    assert len(reviews.access_calls) == 4


async def test_a_review_that_fails_is_500_and_not_cached():
    reviews = FakeReviews(allowed={("bob", "proxy")})
    reviews.fail = True
    authorizer = auth.ClusterAuthorizer("n", reviews)
    with pytest.raises(web.HTTPInternalServerError):
        await authorizer.authorize(User("bob"), "GET", "/containerLogs/a/b/c")
    reviews.fail = False
    await authorizer.authorize(User("bob"), "GET", "/containerLogs/a/b/c")


def test_the_cache_keeps_at_most_its_maximum():
    cache = auth.TtlCache(maximum=2)
    for key in "abc":
        cache.put(key, True, 60)
    assert cache.get("a") is None and cache.get("b") and cache.get("c")


def test_attributes_are_hashable_cache_keys():
    assert hash(authmap.Attributes("get", "proxy", "n"))


def bearer(token, remote="192.0.2.7"):
    transport = SimpleNamespace(get_extra_info=lambda name: None)
    return SimpleNamespace(transport=transport, headers={"Authorization": f"Bearer {token}"}, remote=remote)


async def test_made_up_tokens_cost_the_api_server_a_bounded_number_of_reviews():
    clock = Clock()
    reviews = FakeReviews(tokens={"good": User("alice", ("dev",))})
    authorizer = auth.ClusterAuthorizer("n", reviews, clock)
    await authorizer.authenticate(bearer("good"))  # reviewed once, then cached
    answers = []
    for i in range(auth.REVIEW_BURST * 3):  # a new bogus token each time, from one address
        try:
            await authorizer.authenticate(bearer(f"bogus-{i}"))
        except web.HTTPException as err:
            answers.append(err)
    assert reviews.token_calls == auth.REVIEW_BURST  # the burst, the first of them the good token's
    limited = [a for a in answers if isinstance(a, web.HTTPTooManyRequests)]
    assert len(limited) == auth.REVIEW_BURST * 2 + 1 and limited[0].headers["Retry-After"] == str(auth.RETRY_AFTER)
    assert (await authorizer.authenticate(bearer("good"))).name == "alice"  # a cached token is never held back
    assert (await authorizer.authenticate(request(CERT))).name == "kube-apiserver-kubelet-client"  # nor a certificate
    other = bearer("from-elsewhere", remote="198.51.100.9")  # another address has a bucket of its own
    with pytest.raises(web.HTTPUnauthorized):
        await authorizer.authenticate(other)
    assert reviews.token_calls == auth.REVIEW_BURST + 1
    clock.now += 1.0  # a second later: REVIEW_RATE more for the first address
    for i in range(int(auth.REVIEW_RATE)):
        with pytest.raises(web.HTTPUnauthorized):
            await authorizer.authenticate(bearer(f"later-{i}"))
    with pytest.raises(web.HTTPTooManyRequests):
        await authorizer.authenticate(bearer("one-too-many"))


async def test_many_addresses_together_are_held_to_the_budget_of_all():
    clock = Clock()
    reviews = FakeReviews()
    authorizer = auth.ClusterAuthorizer("n", reviews, clock)
    refused = 0
    for i in range(auth.REVIEW_BURST_ALL + 10):  # each from an address of its own
        try:
            await authorizer.authenticate(bearer(f"bogus-{i}", remote=f"10.0.{i // 250}.{i % 250}"))
        except web.HTTPTooManyRequests:
            refused += 1
        except web.HTTPUnauthorized:
            pass
    assert reviews.token_calls == auth.REVIEW_BURST_ALL and refused == 10


def test_the_review_budget_forgets_addresses_whose_bucket_filled_up_and_keeps_at_most_its_maximum():
    clock = Clock()
    budget = auth.ReviewBudget(clock, maximum=3)
    for i in range(5):
        assert budget.allow(f"a{i}")
    assert len(budget) == 3
    clock.now += auth.REVIEW_BURST / auth.REVIEW_RATE  # long enough for every bucket to fill up again
    assert budget.allow("b") and len(budget) == 1
