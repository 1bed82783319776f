"""Bounded label values: every client-supplied metric label is clamped (compatibility.md §6).

The service-type, purpose and model labels keep the loaded catalogue's names only
(`LabelBounds`, one per app's `Metrics`), so a label set is as bounded as the catalogue.
The fixed sets below, and the catalogue's names, are also the values a metric's series are
created with at start (known_series.py)."""

from __future__ import annotations

import re

from ..catalog import BUILTIN_CATALOG, Catalog

_METHODS = frozenset({"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"})
_FIREFOX_VERSION = re.compile(r".*?Firefox/(\d+)\.\d+")

# ISO 3166-1 alpha-2, officially assigned codes (249).
COUNTRY_CODES = frozenset(
    """
    AD AE AF AG AI AL AM AO AQ AR AS AT AU AW AX AZ BA BB BD BE BF BG BH BI BJ BL BM BN BO BQ
    BR BS BT BV BW BY BZ CA CC CD CF CG CH CI CK CL CM CN CO CR CU CV CW CX CY CZ DE DJ DK DM
    DO DZ EC EE EG EH ER ES ET FI FJ FK FM FO FR GA GB GD GE GF GG GH GI GL GM GN GP GQ GR GS
    GT GU GW GY HK HM HN HR HT HU ID IE IL IM IN IO IQ IR IS IT JE JM JO JP KE KG KH KI KM KN
    KP KR KW KY KZ LA LB LC LI LK LR LS LT LU LV LY MA MC MD ME MF MG MH MK ML MM MN MO MP MQ
    MR MS MT MU MV MW MX MY MZ NA NC NE NF NG NI NL NO NP NR NU NZ OM PA PE PF PG PH PK PL PM
    PN PR PS PT PW PY QA RE RO RS RU RW SA SB SC SD SE SG SH SI SJ SK SL SM SN SO SR SS ST SV
    SX SY SZ TC TD TF TG TH TJ TK TL TM TN TO TR TT TV TW TZ UA UG UM US UY UZ VA VC VE VG VI
    VN VU WF WS YE YT ZA ZM ZW
    """.split()
)


# `mlpa_shed_requests_total{reason}` (process/overload.py).
EVENT_LOOP_LAG = "event_loop_lag"
OPEN_STREAMS = "open_streams"
ADMISSIONS = "admissions"
ACCEPT_QUEUE = "accept_queue"
SHED_REASONS = (EVENT_LOOP_LAG, ACCEPT_QUEUE, OPEN_STREAMS, ADMISSIONS)

# `at` of `mlpa_budget_rows_restored_total` and `mlpa_budget_links_restored_total`
# (store/budget_links.py): where a repair happened. Rows are written again on demand only
# (at start every row is simply written); users are relinked at start and per request.
AT_START = "start"
AT_ADMISSION = "admission"
AT_REQUEST = "request"
AT_BUDGET_CHANGE = "budget_change"
BUDGET_ROW_REPAIR_SITES = (AT_ADMISSION, AT_REQUEST, AT_BUDGET_CHANGE)
BUDGET_LINK_REPAIR_SITES = (AT_START, AT_REQUEST)


class LabelBounds:
    """The catalogue's names as label values; anything else is one fixed value."""

    __slots__ = ("_models", "_service_types", "_purposes")

    def __init__(self, catalog: Catalog = BUILTIN_CATALOG) -> None:
        self._models = catalog.known_models
        self._service_types = frozenset(catalog.names)
        self._purposes = frozenset(catalog.all_purposes)

    @property
    def models(self) -> tuple[str, ...]:
        """The catalogue's models, sorted: the `model` values known up front."""
        return tuple(sorted(self._models))

    @property
    def service_types(self) -> tuple[str, ...]:
        """The catalogue's service types, sorted: the `service_type` values known up front."""
        return tuple(sorted(self._service_types))

    def model(self, model: str | None) -> str:
        return model if model in self._models else "invalid"

    def service_type(self, value: str | None) -> str:
        if not value:
            return ""
        return value if value in self._service_types else "other"

    def purpose(self, value: str | None) -> str:
        if not value:
            return ""
        return value if value in self._purposes else "other"


def clamp_method(value: str) -> str:
    upper = value.upper()
    return upper if upper in _METHODS else "INVALID"


def clamp_country(value: str | None) -> str:
    return value if value in COUNTRY_CODES else "unknown"


def major_firefox_version(user_agent: str | None) -> str:
    """The Firefox major version from a User-Agent, kept only if 100..199."""
    if not user_agent:
        return ""
    match = _FIREFOX_VERSION.match(user_agent)
    if match is None:
        return ""
    major = match.group(1)
    return major if len(major) == 3 and major.startswith("1") else "unknown"
