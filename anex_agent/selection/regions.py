"""The six documented regions and the ISO 3166-1 alpha-2 country codes in each.

Regions (Anex docs, "Allowed Regions"): europe, north-america, asia-pacific, africa,
south-america, oceania. The split follows the UN M49 geoscheme continents, with:

* the Americas cut at the Panama/Colombia border: north-america is Northern America,
  Central America and the Caribbean; south-america is the South American continent
  (including the Falklands, South Georgia and Bouvet Island);
* asia-pacific is all of UN Asia (Central, Eastern, South-eastern, Southern and Western
  Asia, the Middle East and Turkey included);
* Cyprus (an EU member state) counted in europe rather than Western Asia;
* oceania is Australia/New Zealand, Melanesia, Micronesia and Polynesia (UN Oceania).

Every assigned ISO code belongs to exactly one region, except AQ (Antarctica), which
belongs to none: no provider hosts machines there.
"""

from __future__ import annotations

_AFRICA = (
    # Northern Africa
    "DZ EG EH LY MA SD TN "
    # Eastern Africa (incl. British Indian Ocean Territory, French Southern Territories)
    "BI DJ ER ET IO KE KM MG MU MW MZ RE RW SC SO SS TF TZ UG YT ZM ZW "
    # Middle Africa
    "AO CD CF CG CM GA GQ ST TD "
    # Southern Africa
    "BW LS NA SZ ZA "
    # Western Africa
    "BF BJ CI CV GH GM GN GW LR ML MR NE NG SH SL SN TG"
)
_NORTH_AMERICA = (
    # Northern America
    "BM CA GL PM US "
    # Central America
    "BZ CR GT HN MX NI PA SV "
    # Caribbean
    "AG AI AW BB BL BQ BS CU CW DM DO GD GP HT JM KN KY LC MF MQ MS PR SX TC TT VC VG VI"
)
_SOUTH_AMERICA = "AR BO BR BV CL CO EC FK GF GS GY PE PY SR UY VE"
_ASIA_PACIFIC = (
    # Central Asia
    "KG KZ TJ TM UZ "
    # Eastern Asia
    "CN HK JP KP KR MN MO TW "
    # South-eastern Asia
    "BN ID KH LA MM MY PH SG TH TL VN "
    # Southern Asia
    "AF BD BT IN IR LK MV NP PK "
    # Western Asia (Cyprus is in europe, see the module docstring)
    "AE AM AZ BH GE IL IQ JO KW LB OM PS QA SA SY TR YE"
)
_EUROPE = (
    # Eastern Europe
    "BG BY CZ HU MD PL RO RU SK UA "
    # Northern Europe
    "AX DK EE FI FO GB GG IE IM IS JE LT LV NO SE SJ "
    # Southern Europe
    "AD AL BA ES GI GR HR IT ME MK MT PT RS SI SM VA "
    # Western Europe
    "AT BE CH DE FR LI LU MC NL "
    # EU member state geographically in Western Asia
    "CY"
)
_OCEANIA = (
    # Australia and New Zealand
    "AU CC CX HM NF NZ "
    # Melanesia
    "FJ NC PG SB VU "
    # Micronesia
    "FM GU KI MH MP NR PW UM "
    # Polynesia
    "AS CK NU PF PN TK TO TV WF WS"
)

REGIONS: dict[str, frozenset[str]] = {
    "europe": frozenset(_EUROPE.split()),
    "north-america": frozenset(_NORTH_AMERICA.split()),
    "asia-pacific": frozenset(_ASIA_PACIFIC.split()),
    "africa": frozenset(_AFRICA.split()),
    "south-america": frozenset(_SOUTH_AMERICA.split()),
    "oceania": frozenset(_OCEANIA.split()),
}

REGION_NAMES: tuple[str, ...] = tuple(REGIONS)


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
    code = country.upper()
    for name, codes in REGIONS.items():
        if code in codes:
            return name
    return None


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
