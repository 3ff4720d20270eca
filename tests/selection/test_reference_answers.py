"""The providers' reference answers (tests/selection/fixtures/) against what the code reads.

* Vast.AI: every field ``offer_from_api`` reads is listed in ``FIELDS_READ`` (and in
  docs/selection.md), and the reference answer carries each of them with its documented unit;
* RunPod: a GraphQL answer holds exactly the fields the query selects, so the reference
  answer's shape must be the selection set of ``QUERY``, and every field the code reads is in it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from anex_agent.providers.runpod import offers as runpod
from anex_agent.providers.vastai import offers as vastai
from tests.selection.fake_providers import RUNPOD_ANSWER, VAST_ANSWER, VAST_OFFERS

DOC = (Path(__file__).resolve().parents[2] / "docs" / "selection.md").read_text()


class Recording(dict):
    """A dict that remembers which keys were read."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)


@pytest.mark.parametrize("raw", VAST_OFFERS, ids=lambda o: str(o["id"]))
def test_vast_reads_only_the_listed_fields(raw):
    recording = Recording(raw)
    vastai.offer_from_api(recording)
    assert recording.read <= set(vastai.FIELDS_READ)


def test_vast_reference_answer_has_every_field_read_with_its_unit():
    optional = {"datacenter"}  # read when present; the search answer gives hosting_type
    for offer in VAST_OFFERS:
        assert set(vastai.FIELDS_READ) - optional <= set(offer)
        assert isinstance(offer["compute_cap"], int) and offer["compute_cap"] >= 100  # x100
        assert offer["gpu_ram"] > 1000 and offer["cpu_ram"] > 1000  # MB, not GB
        assert re.fullmatch(r".+, [A-Z]{2}", offer["geolocation"])
        assert offer["verification"] in ("verified", "unverified") and offer["hosting_type"] in (0, 1)
    assert set(VAST_ANSWER) == {"offers"}


def test_vast_verification_string_stands_in_for_a_missing_verified():
    base = {k: v for k, v in VAST_OFFERS[0].items() if k != "verified"}
    assert vastai.offer_from_api({**base, "verification": "verified"}).verified is True
    assert vastai.offer_from_api({**base, "verification": "deverified"}).verified is False
    assert vastai.offer_from_api({k: v for k, v in base.items() if k != "verification"}).verified is None


def selection_set(query: str) -> dict:
    """Field name -> nested selection ({} for a leaf), from a GraphQL query (no fragments)."""
    body = query[query.index("{") + 1:query.rindex("}")]
    body = re.sub(r"\([^)]*\)", "", body)  # arguments
    tokens = re.findall(r"[A-Za-z_][A-Za-z0-9_]*|[{}]", body)
    root: dict = {}
    stack = [root]
    last = None
    for token in tokens:
        if token == "{":
            stack[-1][last] = {}
            stack.append(stack[-1][last])
        elif token == "}":
            stack.pop()
        else:
            stack[-1][token] = {}
            last = token
    return root


def shape_matches(value, selection: dict, path: str) -> None:
    if not selection:
        assert not isinstance(value, (dict, list)), f"{path} is a leaf"
        return
    items = value if isinstance(value, list) else [value]
    for item in items:
        if item is None:
            continue
        assert set(item) == set(selection), f"{path}: {sorted(set(item) ^ set(selection))}"
        for key, sub in selection.items():
            shape_matches(item[key], sub, f"{path}.{key}")


def test_runpod_reference_answer_is_exactly_the_query_selection():
    selection = selection_set(runpod.QUERY)
    assert set(selection) == {"gpuTypes", "dataCenters"}
    assert set(RUNPOD_ANSWER) == {"data"}
    shape_matches(RUNPOD_ANSWER["data"], selection, "data")


def test_runpod_fields_read_are_selected_by_the_query():
    selection = selection_set(runpod.QUERY)
    for entry in runpod.FIELDS_READ:
        head, _, rest = entry.partition(" / ")
        path = head.replace("[]", "").split(".")
        names = [path[-1], *rest.split(" / ")] if rest else [path[-1]]
        node = selection
        for part in path[:-1]:
            node = node[part]
        for name in names:
            assert name in node, entry


def test_runpod_reference_answer_becomes_offers():
    offers = runpod.offers_from_answer(RUNPOD_ANSWER["data"], 2)
    assert {o.datacenter_id for o in offers} == {"EU-RO-1", "US-CA-2"}  # EU-SE-1 has nothing in stock
    assert all(o.price > 0 and o.vram_mb % 1024 == 0 for o in offers)


@pytest.mark.parametrize("field", [*vastai.FIELDS_READ, "gpuTypes", "dataCenters", "lowestPrice", "minVcpu",
                                   "minMemory", "gpuAvailability", "stockStatus", "memoryInGb"])
def test_docs_name_every_field_the_code_relies_on(field):
    assert f"`{field}`" in DOC
