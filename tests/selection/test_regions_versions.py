"""Regions: upstream Anex's table answered code for code, plus every ISO 3166-1 alpha-2 code it
leaves out, each exactly once (AQ excepted); versions order."""

from __future__ import annotations

import pytest

from anex_agent.selection import regions
from anex_agent.selection.units import compute_cap_key, compute_cap_text
from anex_agent.selection.versions import key_to_text, parse_version, version_key

# All 249 officially assigned ISO 3166-1 alpha-2 codes, alphabetical (written independently of regions.py).
ISO_3166 = """
AD AE AF AG AI AL AM AO AQ AR AS AT AU AW AX AZ BA BB BD BE BF BG BH BI BJ BL BM BN BO BQ BR BS BT BV BW BY BZ
CA CC CD CF CG CH CI CK CL CM CN CO CR CU CV CW CX CY CZ DE DJ DK DM DO DZ EC EE EG EH ER ES ET FI FJ FK FM FO FR
GA GB GD GE GF GG GH GI GL GM GN GP GQ GR GS GT GU GW GY HK HM HN HR HT HU ID IE IL IM IN IO IQ IR IS IT JE JM JO JP
KE KG KH KI KM KN KP KR KW KY KZ LA LB LC LI LK LR LS LT LU LV LY MA MC MD ME MF MG MH MK ML MM MN MO MP MQ MR MS
MT MU MV MW MX MY MZ NA NC NE NF NG NI NL NO NP NR NU NZ OM PA PE PF PG PH PK PL PM PN PR PS PT PW PY QA RE RO RS
RU RW SA SB SC SD SE SG SH SI SJ SK SL SM SN SO SR SS ST SV SX SY SZ TC TD TF TG TH TJ TK TL TM TN TO TR TT TV TW
TZ UA UG UM US UY UZ VA VC VE VG VI VN VU WF WS YE YT ZA ZM ZW
""".split()


def test_iso_list_has_249_codes():
    assert len(ISO_3166) == len(set(ISO_3166)) == 249


def test_all_six_documented_regions_exist():
    assert set(regions.REGIONS) == {"europe", "north-america", "asia-pacific", "africa", "south-america", "oceania"}


# Upstream Anex's country table (cloudprovider/vastai/regions.go), written out independently of regions.py;
# its list "asia" is the annotation value asia-pacific.
UPSTREAM_TABLE = {
    "europe": "AD AL AT BA BE BG CH CY CZ DE DK EE ES FI FR GB GR HR HU IE IS IT LI LT LU LV MC MD ME MK MT NL NO PL PT "
              "RO RS SE SI SK SM TR VA XK",
    "north-america": "US CA MX",
    "asia-pacific": "AF AM AZ BD BH BN BT CN GE HK ID IN IQ IR JO JP KG KH KP KR KW KZ LA LB LK MM MN MO MV MY NP OM "
                    "PH PK PS QA RU SA SG SY TH TJ TM TW UZ VN YE",
    "africa": "AO BF BI BJ BW CD CF CG CI CM CV DJ DZ EG EH ER ET GA GH GM GN GQ GW KE KM LR LS LY MA MG ML MR MU MW "
              "MZ NA NE NG RW SC SD SL SN SO SS ST SZ TD TG TN TZ UG ZA ZM ZW",
    "south-america": "AR BO BR CL CO EC FK GF GY PE PY SR UY VE",
    "oceania": "AS AU CK FJ FM GU KI MH MP NC NF NR NU NZ PF PG PN PW SB TK TO TV VU WF WS",
}
UPSTREAM_OF = {code: name for name, codes in UPSTREAM_TABLE.items() for code in codes.split()}


def test_every_country_upstream_lists_is_answered_as_upstream_answers():
    assert len(UPSTREAM_OF) == 188
    wrong = {code: (regions.region_of(code), name) for code, name in UPSTREAM_OF.items()
             if regions.region_of(code) != name}
    assert wrong == {}
    assert (regions.region_of("TR"), regions.region_of("XK"), regions.region_of("RU")) == \
        ("europe", "europe", "asia-pacific")


@pytest.mark.parametrize("code,region", [
    ("UA", "europe"), ("BY", "europe"), ("IL", "asia-pacific"), ("AE", "asia-pacific"), ("PA", "north-america"),
    ("CR", "north-america"), ("JM", "north-america"), ("PR", "north-america"), ("DO", "north-america"),
    ("GL", "north-america"), ("TL", "asia-pacific"), ("RE", "africa"), ("GS", "south-america"), ("CX", "oceania")])
def test_countries_upstream_leaves_out_are_still_placed(code, region):
    assert code not in UPSTREAM_OF
    assert regions.region_of(code) == region


def test_every_country_in_exactly_one_region_except_antarctica():
    seen: dict[str, str] = {}
    for name, codes in regions.REGIONS.items():
        for code in codes:
            assert code not in seen, f"{code} in {seen.get(code)} and {name}"
            seen[code] = name
    assert set(seen) == (set(ISO_3166) - {"AQ"}) | {"XK"}  # XK: user-assigned, listed by upstream


def test_the_table_is_upstreams_plus_what_it_leaves_out():
    for name in regions.REGIONS:
        assert regions.UPSTREAM[name] == frozenset(UPSTREAM_TABLE[name].split())
        assert not regions.LEFT_OUT[name] & set(UPSTREAM_OF)
    assert set().union(*regions.LEFT_OUT.values()) == set(ISO_3166) - {"AQ"} - set(UPSTREAM_OF)


@pytest.mark.parametrize("code,region", [("CZ", "europe"), ("US", "north-america"), ("SG", "asia-pacific"),
                                         ("KE", "africa"), ("CL", "south-america"), ("NZ", "oceania"),
                                         ("tr", "europe"), ("RU", "asia-pacific"), ("XK", "europe"),
                                         ("AQ", None), ("XX", None), (None, None)])
def test_region_of(code, region):
    assert regions.region_of(code) == region


@pytest.mark.parametrize("text,code", [("Czechia, CZ", "CZ"), ("US", "US"), ("California, US", "US"),
                                       ("us-ca", "US"), ("", None), (None, None), ("Somewhere", None)])
def test_country_from_location(text, code):
    assert regions.country_from_location(text) == code


def test_versions_order_as_versions():
    assert version_key("12.10") > version_key("12.9") > version_key("12.1") == version_key("12.1.0")
    assert version_key("12") == version_key("12.0.0") < version_key("12.0.1")
    assert parse_version("11.8") == (11, 8, 0)
    assert key_to_text(version_key("12.10")) == "12.10"


@pytest.mark.parametrize("bad", ["", "12.", ".1", "12.x", "1.2.3.4", "v12", "1000.0", "-1"])
def test_bad_versions(bad):
    with pytest.raises(ValueError):
        version_key(bad)


def test_compute_cap_is_x100():
    assert compute_cap_key("8.6") == 860 and compute_cap_key("12.0") == 1200 and compute_cap_key("9") == 900
    assert compute_cap_text(890.0) == "8.9"
    with pytest.raises(ValueError):
        compute_cap_key("8.65")
