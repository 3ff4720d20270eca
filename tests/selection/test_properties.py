"""Property tests (hypothesis) of filtering and ranking."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from anex_agent.selection.annotations import parse_annotations
from anex_agent.selection.filters import apply_filters
from anex_agent.selection.offers import Offer, OfferTable
from anex_agent.selection.rank import rank
from anex_agent.selection.versions import version_key

NAN = float("nan")
GPU_NAMES = ["RTX 4090", "RTX 3090", "A100 SXM4", "H100 SXM", "RTX 3080"]
COUNTRIES = ["DE", "US", "JP", "BR", "ZA", "AU", None]
CUDAS = ["11.8", "12.1", "12.4", "12.9", "12.10"]

maybe = lambda s: st.one_of(st.just(NAN), s)  # noqa: E731

# Every strategy is built once, here: a strategy object built inside a composite on each draw is
# validated and labelled anew every time, which cost hypothesis more than the test itself.
PROVIDERS = st.sampled_from(["vastai", "runpod", "onprem"])
MACHINE_IDS = st.integers(0, 5)
GPU_NAME = st.sampled_from(GPU_NAMES)
GPU_COUNT = maybe(st.sampled_from([1.0, 2.0, 4.0, 8.0]))
VRAM = maybe(st.sampled_from([10240.0, 16384.0, 24576.0, 81920.0]))
CPU_CORES = maybe(st.sampled_from([4.0, 8.0, 16.0]))
RAM = maybe(st.sampled_from([16384.0, 32768.0, 65536.0]))
PRICE = maybe(st.sampled_from([0.2, 0.5, 1.0, 1.5, 2.0, 3.5]))
DOWNLOAD = maybe(st.sampled_from([100.0, 1000.0, 5000.0]))
CUDA = maybe(st.sampled_from([float(version_key(v)) for v in CUDAS]))
COMPUTE_CAP = maybe(st.sampled_from([800.0, 860.0, 890.0, 900.0]))
TRI_STATE = st.sampled_from([True, False, None])
COUNTRY = st.sampled_from(COUNTRIES)
DATACENTER_ID = st.sampled_from(["EU-RO-1", "US-CA-2"])
OFFER_COUNT = st.integers(0, 25)


@st.composite
def offers(draw):
    n = draw(OFFER_COUNT)
    out = []
    for i in range(n):
        provider = draw(PROVIDERS)
        out.append(Offer(
            provider=provider, offer_id=f"o{i}", machine_id=f"m{draw(MACHINE_IDS)}",
            gpu_name=draw(GPU_NAME),
            gpu_count=draw(GPU_COUNT),
            vram_mb=draw(VRAM),
            cpu_cores=draw(CPU_CORES),
            ram_mb=draw(RAM),
            price=draw(PRICE),
            download_mbps=draw(DOWNLOAD),
            cuda=draw(CUDA),
            compute_cap=draw(COMPUTE_CAP),
            verified=draw(TRI_STATE),
            datacenter=draw(TRI_STATE),
            country=draw(COUNTRY),
            cloud_type="SECURE" if provider == "runpod" else None,
            datacenter_id=draw(DATACENTER_ID) if provider == "runpod" else None,
        ))
    return out


NUMERIC = {"gpu-count": ["1", "2", "4"], "vram": ["16384", "24576"], "cpu": ["4", "8", "16"],
           "ram": ["16384", "32768"], "price": ["0.5", "1.0", "1.50", "2"], "download-speed": ["100", "1000"],
           "cuda": CUDAS}
ANNOTATION_KIND = st.sampled_from(["numeric", "region", "gpu-names", "compute-cap", "vast"])
NUMERIC_NAME = st.sampled_from(sorted(NUMERIC))
NUMERIC_VALUE = {name: st.sampled_from(values) for name, values in NUMERIC.items()}
SUFFIX = st.sampled_from(["", "-min", "-max"])
REGIONS = st.lists(st.sampled_from(["europe", "north-america", "asia-pacific", "africa", "south-america", "oceania"]),
                   min_size=1, max_size=3)
GPU_NAME_LISTS = st.lists(st.sampled_from(GPU_NAMES), min_size=1, max_size=3)
COMPUTE_CAPS = st.lists(st.sampled_from(["8.0", "8.6", "8.9", "9.0"]), min_size=1, max_size=3)
VAST_FLAG = st.sampled_from(["verified-only", "datacenter-only"])
BOOLEAN_TEXT = st.sampled_from(["true", "false"])


@st.composite
def one_annotation(draw):
    kind = draw(ANNOTATION_KIND)
    if kind == "numeric":
        name = draw(NUMERIC_NAME)
        suffix = draw(SUFFIX)
        return f"anex.sh/{name}{suffix}", draw(NUMERIC_VALUE[name])
    if kind == "region":
        names = draw(REGIONS)
        return "anex.sh/region", ",".join(names)
    if kind == "gpu-names":
        return "anex.sh/gpu-names", ",".join(draw(GPU_NAME_LISTS))
    if kind == "compute-cap":
        return "anex.sh/compute-cap", ",".join(draw(COMPUTE_CAPS))
    name = draw(VAST_FLAG)
    return f"vastai.anex.sh/{name}", draw(BOOLEAN_TEXT)


ANNOTATION_LISTS = st.lists(one_annotation(), max_size=5)


@st.composite
def annotation_sets(draw):
    pairs = draw(ANNOTATION_LISTS)
    out = dict(pairs)
    for name in NUMERIC:  # keep -min <= -max so the set is valid
        lo, hi = out.get(f"anex.sh/{name}-min"), out.get(f"anex.sh/{name}-max")
        if lo is not None and hi is not None:
            key = version_key if name == "cuda" else float
            if key(lo) > key(hi):
                out[f"anex.sh/{name}-min"], out[f"anex.sh/{name}-max"] = hi, lo
    return out


def selected(offer_list, annotations) -> list[str]:
    t = OfferTable(offer_list)
    f = parse_annotations(annotations)
    return [t.offers[i].offer_id for i in rank(t, apply_filters(t, f).rows, f)]


SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(offers(), st.sampled_from(sorted(NUMERIC)), st.data())
def test_exact_overrides_range(offer_list, name, data):
    values = NUMERIC[name]
    exact = data.draw(NUMERIC_VALUE[name])  # st.sampled_from(values), built once
    lo = data.draw(NUMERIC_VALUE[name])
    hi = data.draw(NUMERIC_VALUE[name])  # may be below lo: ignored because exact is set
    with_range = {f"anex.sh/{name}": exact, f"anex.sh/{name}-min": lo, f"anex.sh/{name}-max": hi}
    assert selected(offer_list, with_range) == selected(offer_list, {f"anex.sh/{name}": exact})


@SETTINGS
@given(offers(), annotation_sets(), one_annotation())
def test_adding_a_filter_never_adds_candidates(offer_list, base, extra):
    key, value = extra
    if key in base or key.startswith("vastai.anex.sh/verified-only"):
        return  # changing an existing filter (or the verified-only default) is not adding one
    name = key.removeprefix("anex.sh/").removesuffix("-min").removesuffix("-max")
    same_range = {f"anex.sh/{name}", f"anex.sh/{name}-min", f"anex.sh/{name}-max"}
    if f"anex.sh/{name}" in {key, *base} and same_range & set(base):
        return  # an exact value replaces that range's -min/-max (and is ignored beside them): not an added filter
    bigger = {**base, key: value}
    lo, hi = bigger.get(f"anex.sh/{name}-min"), bigger.get(f"anex.sh/{name}-max")
    if lo is not None and hi is not None:
        k = version_key if name == "cuda" else float
        if k(lo) > k(hi):
            return
    assert set(selected(offer_list, bigger)) <= set(selected(offer_list, base))


@SETTINGS
@given(offers(), annotation_sets(), st.randoms(use_true_random=False))
def test_list_order_does_not_change_the_result_set(offer_list, annotations, rnd):
    shuffled = {}
    for key, value in annotations.items():
        if key in ("anex.sh/region", "anex.sh/gpu-names", "anex.sh/compute-cap"):
            items = value.split(",")
            rnd.shuffle(items)
            value = ",".join(items)
        shuffled[key] = value
    assert set(selected(offer_list, shuffled)) == set(selected(offer_list, annotations))


@SETTINGS
@given(offers(), annotation_sets(), st.randoms(use_true_random=False))
def test_ordering_is_stable_and_by_price(offer_list, annotations, rnd):
    first = selected(offer_list, annotations)
    again = list(offer_list)
    rnd.shuffle(again)
    assert selected(again, annotations) == first  # same ranking whatever order the providers answered in
    assert selected(offer_list, annotations) == first  # and the same on every call
    by_id = {o.offer_id: o for o in offer_list}
    prices = [by_id[i].price for i in first]
    known = [p for p in prices if p == p]
    assert known == sorted(known) and prices[:len(known)] == known  # unknown prices last


def ranked(offer_list, annotations, default="price") -> list[Offer]:
    t = OfferTable(offer_list)
    f = parse_annotations(annotations)
    return [t.offers[i] for i in rank(t, apply_filters(t, f).rows, f, default)]


def price_key(o: Offer) -> tuple:
    return (o.price if o.price == o.price else float("inf"), {"onprem": 0, "vastai": 1, "runpod": 2}[o.provider],
            o.offer_id, o.machine_id or "")


@SETTINGS
@given(offers(), annotation_sets())
def test_price_ordering_cheapest_first_onprem_wins_ties(offer_list, annotations):
    got = ranked(offer_list, {**annotations, "anex.sh/ordering": "price"})
    assert [price_key(o) for o in got] == sorted(price_key(o) for o in got)
    assert [o.offer_id for o in ranked(offer_list, annotations)] == [o.offer_id for o in got]  # default: price


@SETTINGS
@given(offers(), annotation_sets(), st.sampled_from(["pod", "coordinator"]))
def test_prefer_onprem_puts_every_onprem_node_before_any_rented_offer(offer_list, annotations, where):
    if where == "pod":
        got = ranked(offer_list, {**annotations, "anex.sh/ordering": "prefer-onprem"})
    else:
        got = ranked(offer_list, annotations, default="prefer-onprem")
    by_price = ranked(offer_list, annotations)
    assert set(o.offer_id for o in got) == set(o.offer_id for o in by_price)  # same candidates, other order
    kinds = [o.provider == "onprem" for o in got]
    assert kinds == sorted(kinds, reverse=True)  # all on-prem first
    onprem = [o for o in got if o.provider == "onprem"]
    rented = [o for o in got if o.provider != "onprem"]
    assert [price_key(o) for o in onprem] == sorted(price_key(o) for o in onprem)
    if not annotations.get("runpod.anex.sh/datacenter-ids"):
        assert [price_key(o) for o in rented] == sorted(price_key(o) for o in rented)


def test_prefer_onprem_beats_a_cheaper_rented_offer_and_the_pod_overrides_the_coordinator():
    cheap_rented = Offer(provider="vastai", offer_id="v", machine_id="m", gpu_name="RTX 4090", price=0.2,
                         verified=True)
    onprem = Offer(provider="onprem", offer_id="n", machine_id="n", gpu_name="RTX 4090", price=0.9)
    assert [o.offer_id for o in ranked([cheap_rented, onprem], {})] == ["v", "n"]
    assert [o.offer_id for o in ranked([cheap_rented, onprem], {}, "prefer-onprem")] == ["n", "v"]
    assert [o.offer_id for o in ranked([cheap_rented, onprem], {"anex.sh/ordering": "prefer-onprem"})] == ["n", "v"]
    assert [o.offer_id for o in ranked([cheap_rented, onprem], {"anex.sh/ordering": "price"},
                                       "prefer-onprem")] == ["v", "n"]
