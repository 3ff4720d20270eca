"""Qualification policies (sets of rule ids) and the node labels that steer selection."""

from __future__ import annotations

import pytest

from anex_agent.gpu.qualify import RULES
from anex_agent.selection import labels
from anex_agent.selection.qualification import POLICIES, parse_policy


def test_policies_are_sets_of_the_agents_rule_ids():
    assert POLICIES["runnable"] == frozenset()
    assert POLICIES["required"] == {"gpu_model", "nvme_drives", "nvme_capacity", "tpm"}
    assert POLICIES["full"] == {rule.id for rule in RULES}
    assert POLICIES["required"] == {rule.id for rule in RULES if rule.scope == "required"}


@pytest.mark.parametrize("text,rules", [
    ("runnable", set()), ("Full", {r.id for r in RULES}), ("required,memory", POLICIES["required"] | {"memory"}),
    ("tpm", {"tpm"}), (" tpm , nvme_drives ", {"tpm", "nvme_drives"}), ("driver_loaded", set()),
])
def test_parse_policy(text, rules):
    assert parse_policy(text) == rules


@pytest.mark.parametrize("text", ["", " , ", "strict", "required,tmp"])
def test_bad_policy_says_what_is_accepted(text):
    with pytest.raises(ValueError) as info:
        parse_policy(text)
    assert "runnable, required, full" in str(info.value) and "tpm" in str(info.value)


@pytest.mark.parametrize("key,value,stored", [
    ("busy", "TRUE", "true"), ("maintenance", " false ", "false"), ("price-per-hour", "0.40", "0.40"),
    ("country", "cz", "CZ"), ("country", "xk", "XK"), ("download-mbps", "1000", "1000"),
    ("qualification", "Required, TPM", "required,tpm"), ("team", "vision", "vision"), ("example.com/rack", "r1", "r1"),
])
def test_label_values_are_normalized(key, value, stored):
    assert labels.normalize(key, value) == stored


@pytest.mark.parametrize("key,value,expect", [
    ("busy", "yes", "\"true\" or \"false\""), ("maintenance", "1", "\"true\" or \"false\""),
    ("price-per-hour", "-1", "non-negative"), ("price-per-hour", "nan", "USD/hour"),
    ("upload-mbps", "fast", "Mbps"), ("country", "Czechia", "ISO 3166-1"), ("country", "AQ", "ISO 3166-1"),
    ("qualification", "strict", "accepted"), ("-bad", "x", "label key"), ("a" * 64, "x", "label key"),
    ("bad key", "x", "label key"), ("team", "x" * 257, "at most 256"), ("team", "a\x00b", "control character"),
])
def test_bad_labels_say_what_is_accepted(key, value, expect):
    with pytest.raises(ValueError) as info:
        labels.normalize(key, value)
    assert expect in str(info.value)
