"""The six documented regions and the ISO 3166-1 alpha-2 country codes in each.

Regions (Anex docs, "Allowed Regions"): europe, north-america, asia-pacific, africa,
south-america, oceania. The table is **upstream Anex's, plus the countries it leaves out**:

* :data:`UPSTREAM` is upstream Anex's country table, code for code (its list named ``asia``
  is our ``asia-pacific``). Every country it lists is answered as upstream answers it,
  including Turkey (TR) and Kosovo (XK, a user-assigned code in common use) in europe and
  Russia (RU) in asia-pacific. Pods moved from upstream select the same machines.
* :data:`LEFT_OUT` places the countries upstream lists nowhere (so that their machines are
  still reachable by region), following the UN M49 continents: Central America and the
  Caribbean are north-america; Ukraine, Belarus and the European dependencies are europe;
  Israel, the United Arab Emirates and Timor-Leste are asia-pacific; the African island
  territories are africa; South Georgia and Bouvet Island are south-america; the Australian
  and US minor islands are oceania.

Every assigned ISO code belongs to exactly one region, except AQ (Antarctica), which
belongs to none: no provider hosts machines there.
"""

from __future__ import annotations

# Upstream Anex's table (cloudprovider/vastai/regions.go), verbatim; "asia" -> asia-pacific.
UPSTREAM: dict[str, frozenset[str]] = {
    "europe": frozenset(
        "AD AL AT BA BE BG CH CY CZ DE DK EE ES FI FR GB GR HR HU IE IS IT LI LT LU LV MC MD ME MK MT NL NO PL "
        "PT RO RS SE SI SK SM TR VA XK".split()),
    "north-america": frozenset("US CA MX".split()),
    "asia-pacific": frozenset(
        "AF AM AZ BD BH BN BT CN GE HK ID IN IQ IR JO JP KG KH KP KR KW KZ LA LB LK MM MN MO MV MY NP OM PH PK "
        "PS QA RU SA SG SY TH TJ TM TW UZ VN YE".split()),
    "africa": frozenset(
        "AO BF BI BJ BW CD CF CG CI CM CV DJ DZ EG EH ER ET GA GH GM GN GQ GW KE KM LR LS LY MA MG ML MR MU MW "
        "MZ NA NE NG RW SC SD SL SN SO SS ST SZ TD TG TN TZ UG ZA ZM ZW".split()),
    "south-america": frozenset("AR BO BR CL CO EC FK GF GY PE PY SR UY VE".split()),
    "oceania": frozenset("AS AU CK FJ FM GU KI MH MP NC NF NR NU NZ PF PG PN PW SB TK TO TV VU WF WS".split()),
}

# The countries upstream lists nowhere, placed by UN M49 continent.
LEFT_OUT: dict[str, frozenset[str]] = {
    "europe": frozenset(
        # Eastern Europe; Northern Europe (Aland, Faroe, Channel Islands, Man, Svalbard); Gibraltar
        "BY UA AX FO GG IM JE SJ GI".split()),
    "north-america": frozenset(
        # Northern America (Bermuda, Greenland, St Pierre); Central America; the Caribbean
        "BM GL PM BZ CR GT HN NI PA SV "
        "AG AI AW BB BL BQ BS CU CW DM DO GD GP HT JM KN KY LC MF MQ MS PR SX TC TT VC VG VI".split()),
    "asia-pacific": frozenset("AE IL TL".split()),
    "africa": frozenset("IO RE SH TF YT".split()),
    "south-america": frozenset("BV GS".split()),
    "oceania": frozenset("CC CX HM UM".split()),
}

REGIONS: dict[str, frozenset[str]] = {name: UPSTREAM[name] | LEFT_OUT[name] for name in UPSTREAM}

REGION_NAMES: tuple[str, ...] = tuple(REGIONS)
_REGION_OF: dict[str, str] = {code: name for name, codes in REGIONS.items() for code in codes}


def countries_of(regions: list[str] | tuple[str, ...]) -> frozenset[str]:
    """Union of the country codes of the given (already validated) region names."""
    out: set[str] = set()
    for name in regions:
        out |= REGIONS[name]
    return frozenset(out)


def region_of(country: str | None) -> str | None:
    """The region of an ISO alpha-2 country code, or None (unknown code, AQ, missing)."""
    if not country:
        return None
    return _REGION_OF.get(country.upper())


def country_from_location(text: object) -> str | None:
    """The ISO code in a provider location such as ``"Czechia, CZ"``, ``"CZ"`` or ``"US-CA"``.

    Vast.AI ``geolocation`` is ``"<country name>, <CODE>"`` or just ``"<CODE>"``; the code is the
    last comma-separated token when it is two letters. Returns None when there is none.
    """
    if not isinstance(text, str) or not text.strip():
        return None
    token = text.rsplit(",", 1)[-1].strip()
    if len(token) == 2 and token.isalpha():
        return token.upper()
    head = token.split("-", 1)[0]
    if len(head) == 2 and head.isalpha():
        return head.upper()
    return None
