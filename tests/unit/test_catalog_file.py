"""The catalogue file: the shipped example is the built-in catalogue, `render_catalog` reads
back to the same catalogue, every kind of mistake is reported (all at once), and the
settings read the file with the budget and capped-type variables on top; the gunicorn
master's snapshot of the last good file."""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path
from typing import Iterator

import pytest

from mlpa_aiohttp.catalog import BUILTIN_CATALOG, BudgetTier, ServiceType
from mlpa_aiohttp.catalog.file import CatalogError, load_catalog, parse_catalog, render_catalog
from mlpa_aiohttp.process.catalog_snapshot import CatalogSnapshot, snapshot_for_environ
from mlpa_aiohttp.settings import Settings, SettingsError

from ..conftest import TEST_SECRETS

SHIPPED = Path(__file__).resolve().parents[2] / "config" / "catalog.toml"

MINIMAL = """
search_service_types = ["search"]
[[service_type]]
name = "ai"
budget = { max_budget = 0.1, rpm_limit = 40, tpm_limit = 2000 }
[[service_type]]
name = "search"
budget = { max_budget = 0.01, rpm_limit = 10, tpm_limit = 2000 }
"""


def problems_of(text: str) -> list[str]:
    with pytest.raises(CatalogError) as caught:
        parse_catalog(text.encode())
    return list(caught.value.problems)


def test_the_shipped_file_is_the_built_in_catalogue() -> None:
    assert load_catalog(str(SHIPPED)) == BUILTIN_CATALOG


def test_the_built_in_catalogue_is_the_references() -> None:
    assert BUILTIN_CATALOG.names == tuple(st.value for st in ServiceType)
    assert BUILTIN_CATALOG.search_types == ("search", "search-dev", "agent-search")
    assert BUILTIN_CATALOG.dev_types == {"ai-dev", "memories-dev", "mochi-dev", "search-dev"}
    assert BUILTIN_CATALOG.capped_types == {"ai", "memories"}
    assert BUILTIN_CATALOG.pinned_models == {
        "exa": ("answer", "sw-answer"),
        "exa-search": ("search", "search-dev", "agent-search"),
        "liner": ("liner-answer",),
    }
    assert BUILTIN_CATALOG.budgets[ServiceType.AGENT].budget_duration == "7d"
    assert BUILTIN_CATALOG.budgets[ServiceType.SEARCH].max_budget == 0.01


def test_the_references_fifteen_types_and_its_label_allowlist() -> None:
    """MLPA 1.0.39 (§A.4): fifteen types in its order; sw-answer and liner-answer have no
    purposes and no cap, liner-answer's budget is 0.06 under the plural variables."""
    assert BUILTIN_CATALOG.names == (
        "ai", "s2s", "s2s-android", "memories", "search", "answer", "sw-answer", "liner-answer", "telemetry",
        "agent", "agent-search", "ai-dev", "memories-dev", "mochi-dev", "search-dev",
    )  # fmt: skip
    for name in ("sw-answer", "liner-answer"):
        entry = BUILTIN_CATALOG.entry(name)
        assert (entry.purposes, entry.capped, entry.dev) == ((), False, False)
    assert BUILTIN_CATALOG.budgets["sw-answer"] == BudgetTier("end-user-budget-sw-answer", 0.1, 10, 2000, "1d")
    assert BUILTIN_CATALOG.budgets["liner-answer"] == BudgetTier("end-user-budget-liner-answer", 0.06, 10, 2000, "1d")
    assert BUILTIN_CATALOG.budget_infixes["sw-answer"] == "SW_ANSWER"
    assert BUILTIN_CATALOG.budget_infixes["liner-answer"] == "LINER_ANSWERS"
    # The admin budget route's 422 lists them (tests/integration/test_admin_routes.py sends it).
    assert BUILTIN_CATALOG.service_type_list_text() == (
        "ai, s2s, s2s-android, memories, search, answer, sw-answer, liner-answer, telemetry, agent, agent-search, "
        "ai-dev, memories-dev, mochi-dev, search-dev"
    )
    # The reference's quirk: `liner` is pinned, but its allowlist holds `liner-answers`.
    assert BUILTIN_CATALOG.known_models == {
        "exa", "exa-search", "gemini-2.5-flash-lite", "gemini-3.1-flash-lite", "gpt-oss-120b", "liner-answers",
        "openai/gpt-4o", "mistral-small-2503", "mistral-small-2603", "moz-summarization",
        "qwen3-235b-a22b-instruct-2507-maas", "vertex_ai/mistral-small-2503",
    }  # fmt: skip


def test_liner_answer_reads_the_references_plural_variables() -> None:
    env = {**TEST_SECRETS, "USER_FEATURE_BUDGET_LINER_ANSWERS_MAX_BUDGET": "0.5", "USER_FEATURE_BUDGET_SW_ANSWER_RPM_LIMIT": "3"}
    settings = Settings.from_environ(env)
    assert settings.budgets["liner-answer"].max_budget == 0.5
    assert settings.budgets["sw-answer"].rpm_limit == 3
    # The singular spelling is not a variable of this tier.
    unchanged = Settings.from_environ({**TEST_SECRETS, "USER_FEATURE_BUDGET_LINER_ANSWER_MAX_BUDGET": "0.5"})
    assert unchanged.budgets["liner-answer"].max_budget == 0.06


def test_budget_variables_and_metric_label_in_a_file() -> None:
    text = MINIMAL + """
[[service_type]]
name = "quick-answer"
budget = { max_budget = 0.2, rpm_limit = 5, tpm_limit = 100 }
budget_variables = "USER_FEATURE_BUDGET_QUICK_ANSWERS"
[[model]]
name = "quick"
pinned_to = ["quick-answer"]
metric_label = false
"""
    catalog = parse_catalog(text.encode())
    assert catalog.budget_infixes["quick-answer"] == "QUICK_ANSWERS"
    assert catalog.pinned_models == {"quick": ("quick-answer",)} and catalog.known_models == frozenset()
    assert parse_catalog(render_catalog(catalog).encode()) == catalog
    bad = text.replace('"USER_FEATURE_BUDGET_QUICK_ANSWERS"', '"QUICK_ANSWERS"').replace("metric_label = false", 'metric_label = "no"')
    assert problems_of(bad) == [
        "service_type #3 'quick-answer'.budget_variables: expected USER_FEATURE_BUDGET_ then upper-case words joined "
        "by single underscores, got 'QUICK_ANSWERS'",
        "model #1 'quick'.metric_label: expected true or false, got 'no'",
    ]
    # Two types may not share one set of variables.
    shared = text.replace('"USER_FEATURE_BUDGET_QUICK_ANSWERS"', '"USER_FEATURE_BUDGET_AI"')
    assert problems_of(shared) == [
        "service_type #3 'quick-answer': shares its USER_FEATURE_BUDGET_AI_* variables with service_type #1 'ai'"
    ]


def test_rendering_reads_back_to_the_same_catalogue() -> None:
    assert parse_catalog(render_catalog(BUILTIN_CATALOG).encode()) == BUILTIN_CATALOG


def test_defaults_of_a_minimal_file() -> None:
    catalog = parse_catalog(MINIMAL.encode())
    assert catalog.names == ("ai", "search") and catalog.models == ()
    ai = catalog.entry("ai")
    assert (ai.purposes, ai.dev, ai.capped) == ((), False, False)
    assert (ai.budget.budget_id, ai.budget.budget_duration) == ("end-user-budget-ai", "1d")


def test_unknown_keys_get_the_closest_name() -> None:
    problems = problems_of(
        'search_service_type = ["search"]\n' + MINIMAL.replace("rpm_limit = 40", "rpm_limt = 40").replace('name = "search"', 'name = "search"\ncaped = true')
    )
    assert problems == [
        "unknown key 'search_service_type'; did you mean 'search_service_types'?",
        "service_type #1 'ai'.budget: unknown key 'rpm_limt'; did you mean 'rpm_limit'?",
        "service_type #1 'ai'.budget.rpm_limit: missing",
        "service_type #2 'search': unknown key 'caped'; did you mean 'capped'?",
    ]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("rpm_limit = 40", "rpm_limit = 4.5"), "service_type #1 'ai'.budget.rpm_limit: expected an integer of at least 0, got 4.5"),
        (("rpm_limit = 40", "rpm_limit = true"), "service_type #1 'ai'.budget.rpm_limit: expected an integer of at least 0, got True"),
        (("max_budget = 0.1", "max_budget = -1"), "service_type #1 'ai'.budget.max_budget: expected a number of at least 0 (USD), got -1"),
        (("max_budget = 0.1", "max_budget = nan"), "service_type #1 'ai'.budget.max_budget: expected a number of at least 0 (USD), got nan"),
        (('name = "ai"', 'name = "ai"\ndev = "yes"'), "service_type #1 'ai'.dev: expected true or false, got 'yes'"),
        (('name = "ai"', 'name = "ai"\npurposes = "chat"'), "service_type #1 'ai'.purposes: expected a list of purpose names, got 'chat'"),
        (
            ("rpm_limit = 40,", 'rpm_limit = 40, budget_duration = "daily",'),
            "service_type #1 'ai'.budget.budget_duration: expected a LiteLLM duration (\"30s\", \"1h\", \"1d\", \"7d\", \"1mo\"), got 'daily'",
        ),
        (('name = "ai"', 'name = "ai"\npurposes = ["chat", " chat"]'), "service_type #1 'ai'.purposes: purpose name ' chat' is not allowed"),
        (('name = "ai"', 'name = "ai"\npurposes = ["chat", "chat"]'), "service_type #1 'ai'.purposes: purpose 'chat' is listed twice"),
        (('name = "search"', 'name = "search:x"'), "service_type #2 'search:x': service type name 'search:x' is not allowed"),
    ],
)
def test_bad_values_name_where_they_are(change: tuple[str, str], expected: str) -> None:
    problems = problems_of(MINIMAL.replace(*change, 1))
    assert any(problem.startswith(expected) for problem in problems), problems


def test_every_problem_is_listed_at_once() -> None:
    text = MINIMAL + """
[[service_type]]
name = "ai"
budget = { max_budget = 1, rpm_limit = 1, tpm_limit = 1 }
[[service_type]]
name = "labs-dev"
budget = { max_budget = 1, rpm_limit = 1, tpm_limit = 1, budget_id = "end-user-budget-ai" }
[[model]]
name = "liner"
pinned_to = ["liner-answer"]
[[model]]
name = "liner"
[[model]]
name = "Liner Pro"
"""
    assert problems_of(text) == [
        "service_type #3 'ai': duplicate service type 'ai' (also service_type #1)",
        "service_type #4 'labs-dev': 'labs-dev' ends with -dev but dev is not true: set dev = true (dev types need "
        "x-dev-authorization, compatibility.md D11) or choose another name",
        "model #1 'liner'.pinned_to: 'liner-answer' is not a service type of this file",
        "model #2 'liner': duplicate model 'liner'",
        "model #3 'Liner Pro': model name 'Liner Pro' is one the chat route refuses (pattern "
        "^[a-z0-9](?:[a-z0-9./_-]{0,62}[a-z0-9])?$)",
    ]
    # Once labs-dev is a dev type, its borrowed budget row is the next problem.
    fixed = text.replace('name = "labs-dev"', 'name = "labs-dev"\ndev = true')
    assert (
        "service_type #4 'labs-dev': budget.budget_id 'end-user-budget-ai' is also the budget_id of service_type #1 'ai':"
        " each tier needs its own LiteLLM budget row"
    ) in problems_of(fixed)


def test_the_wire_defaults_must_exist() -> None:
    only_ai = MINIMAL.split("[[service_type]]\nname = \"search\"")[0].replace('["search"]', "[]")
    assert problems_of(only_ai) == ["service_type: 'search' is missing: it is the default service-type of /v1/search"]
    not_searchable = MINIMAL.replace('["search"]', "[]")
    assert problems_of(not_searchable) == ["search_service_types: must include 'search' (/v1/search's default)"]


def test_unreadable_files_are_one_problem(tmp_path: Path) -> None:
    with pytest.raises(CatalogError) as missing:
        load_catalog(str(tmp_path / "absent.toml"))
    assert missing.value.problems == ("cannot read the file: No such file or directory",)
    assert problems_of('search_service_types = ["search"\n')[0].startswith("not valid TOML: ")
    with pytest.raises(CatalogError) as binary:
        parse_catalog(b"\xff\xfe")
    assert binary.value.problems == ("not UTF-8 text (byte 0)",)


# -- in the settings -------------------------------------------------------------------------


def settings_with(tmp_path: Path, text: str, **env: str) -> Settings:
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    return Settings.from_environ({**TEST_SECRETS, "MLPA_CATALOG_FILE": str(path), **env})


NEW_TYPE = """
[[service_type]]
name = "deep-answer"
purposes = ["answer"]
capped = true
budget = { max_budget = 0.2, rpm_limit = 5, tpm_limit = 500 }
"""


def test_no_file_is_the_built_in_catalogue() -> None:
    settings = Settings.from_environ(TEST_SECRETS)
    assert settings.catalog == BUILTIN_CATALOG
    assert settings.budgets == BUILTIN_CATALOG.budgets
    assert settings.signup_cap.capped_service_types == {"ai", "memories"}


def test_the_variables_apply_on_top_of_the_file(tmp_path: Path) -> None:
    settings = settings_with(
        tmp_path,
        MINIMAL + NEW_TYPE,
        USER_FEATURE_BUDGET_DEEP_ANSWER_RPM_LIMIT="7",
        USER_FEATURE_BUDGET_AI_MAX_BUDGET="0.3",
    )
    assert settings.catalog.names == ("ai", "search", "deep-answer")
    assert settings.budgets["deep-answer"].rpm_limit == 7 and settings.budgets["deep-answer"].max_budget == 0.2
    assert settings.catalog.entry("ai").budget.max_budget == 0.3
    assert settings.signup_cap.capped_service_types == {"deep-answer"} == settings.catalog.capped_types
    capped = settings_with(tmp_path, MINIMAL + NEW_TYPE, MLPA_CAPPED_SERVICE_TYPES="ai,deep-answer")
    assert capped.signup_cap.capped_service_types == {"ai", "deep-answer"} == capped.catalog.capped_types


def test_file_and_variable_problems_are_one_error(tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(MINIMAL.replace("rpm_limit = 40", 'rpm_limit = "40"'))
    with pytest.raises(SettingsError) as caught:
        Settings.from_environ(
            {**TEST_SECRETS, "MLPA_CATALOG_FILE": str(path), "MLPA_CAPPED_SERVICE_TYPES": "gold", "PORT": "eighty"}
        )
    assert caught.value.problems == (
        "PORT: expected an integer, got 'eighty'",
        f"MLPA_CATALOG_FILE ({path}): service_type #1 'ai'.budget.rpm_limit: expected an integer of at least 0, got '40'",
        "MLPA_CAPPED_SERVICE_TYPES: unknown service type 'gold'",
    )


# -- the service on a file ---------------------------------------------------------------------

ROLES = MINIMAL.replace('["search"]', '["search", "sw-search"]') + """
[[service_type]]
name = "sw-search"
budget = { max_budget = 0.01, rpm_limit = 10, tpm_limit = 2000 }
[[service_type]]
name = "labs-dev"
dev = true
budget = { max_budget = 1, rpm_limit = 100, tpm_limit = 10000 }
[[model]]
name = "gpt-oss-120b"
"""


async def test_search_and_dev_roles_come_from_the_file(make_service, tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(ROLES)
    service = await make_service(MLPA_CATALOG_FILE=str(path))
    search = {"query": "q", "max_results": 1}
    found = await service.client.post("/v1/search", json=search, headers=service.headers(service_type="sw-search"))
    assert found.status == 200
    assert service.litellm.requests_to("/v1/search/exa-search")[-1].json["user"] == "test-uid:sw-search"
    refused = await service.client.post("/v1/search", json=search, headers=service.headers(service_type="ai"))
    assert await refused.json() == {"detail": "service-type header must be one of ['search', 'sw-search']"}

    missing = await service.chat(headers=service.headers(service_type="labs-dev"))
    assert missing.status == 401 and "x-dev-authorization required" in (await missing.json())["detail"]
    ok = await service.chat(headers=service.headers(service_type="labs-dev", x_dev_authorization=TEST_SECRETS["MLPA_EXPERIMENTATION_AUTHORIZATION_TOKEN"]))
    assert ok.status == 200
    # ai-dev is not in this file: the dev key makes no type a dev type.
    gone = await service.chat(headers=service.headers(service_type="ai-dev"))
    assert gone.status == 422
    assert (await gone.json())["detail"][0]["msg"] == "Input should be 'ai', 'search', 'sw-search' or 'labs-dev'"
    admin = await service.client.post(
        "/user/someone:ai/budget", json={"service_type": "mochi-dev"}, headers={"master_key": f"Bearer {TEST_SECRETS['MASTER_KEY']}"}
    )
    assert await admin.json() == {"detail": {"error": "Unknown service type: mochi-dev. Valid values: ai, search, sw-search, labs-dev"}}


# -- the gunicorn master's last good catalogue (catalog_snapshot) -----------------------------


@pytest.fixture
def snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[CatalogSnapshot]:
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    tempfile.tempdir = None  # re-read TMPDIR
    try:
        taken = CatalogSnapshot(str(tmp_path / "catalog.toml"))
        yield taken
        taken.remove()
    finally:
        tempfile.tempdir = None


def test_a_valid_file_becomes_the_snapshot_and_a_broken_one_leaves_it(snapshot: CatalogSnapshot, tmp_path: Path) -> None:
    source = Path(snapshot.source)
    source.write_text(MINIMAL)
    assert snapshot.take({}) == []
    assert Path(snapshot.path).read_text() == MINIMAL
    assert Path(snapshot.path).parent.parent == tmp_path / "tmp"
    assert oct(Path(snapshot.path).parent.stat().st_mode & 0o777) == "0o700"

    source.write_text(MINIMAL.replace("max_budget = 0.1", "max_budget = -1"))
    problems = snapshot.take({})
    assert problems == [
        f"MLPA_CATALOG_FILE ({source}): service_type #1 'ai'.budget.max_budget: expected a number of at least 0 (USD), got -1"
    ]
    assert Path(snapshot.path).read_text() == MINIMAL
    assert sorted(p.name for p in Path(snapshot.path).parent.iterdir()) == ["catalog.toml"]

    # The variables on top count too: a capped type the new file no longer has.
    source.write_text(MINIMAL)
    assert snapshot.take({"MLPA_CAPPED_SERVICE_TYPES": "memories"}) == ["MLPA_CAPPED_SERVICE_TYPES: unknown service type 'memories'"]

    source.unlink()
    (unreadable,) = snapshot.take({})
    assert unreadable.startswith(f"MLPA_CATALOG_FILE ({source}): cannot read the file: ")
    assert Path(snapshot.path).read_text() == MINIMAL


def test_workers_are_pointed_at_the_snapshot(snapshot: CatalogSnapshot) -> None:
    environ = {"mlpa_catalog_file": snapshot.source, "PORT": "8080"}
    snapshot.point_at_snapshot(environ)
    assert environ == {"MLPA_CATALOG_FILE": snapshot.path, "PORT": "8080"}
    assert CatalogSnapshot.for_environ({}) is None


def test_only_the_master_removes_the_snapshot(snapshot: CatalogSnapshot) -> None:
    Path(snapshot.source).write_text(MINIMAL)
    assert snapshot.take({}) == []
    with warnings.catch_warnings():
        # Under pytest-xdist (3.12+ warns) the test process has threads: the child only compares
        # its pid and exits, so no lock another thread may hold is ever taken in it.
        warnings.filterwarnings("ignore", r"This process .* is multi-threaded", DeprecationWarning)
        child = os.fork()
    if child == 0:  # a forked worker exiting runs the inherited exit handler
        snapshot.remove()
        os._exit(0)
    os.waitpid(child, 0)
    assert Path(snapshot.path).is_file()
    snapshot.remove()
    assert not Path(snapshot.path).parent.exists()


def test_no_usable_temporary_directory_is_a_configuration_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "catalog.toml"
    source.write_text(MINIMAL)
    assert snapshot_for_environ({}) == (None, [])
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    snapshot, (problem,) = snapshot_for_environ({"MLPA_CATALOG_FILE": str(source)})
    assert snapshot is None
    assert problem.startswith("MLPA_CATALOG_FILE: gunicorn's master cannot make the directory of its copy")
    assert problem.endswith("set TMPDIR to a writable directory")


def test_a_broken_file_at_start_leaves_no_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "catalog.toml"
    source.write_text(MINIMAL.replace('name = "search"', 'name = "serch"'))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    snapshot, problems = snapshot_for_environ({"MLPA_CATALOG_FILE": str(source)})
    assert snapshot is None and problems and all(p.startswith(f"MLPA_CATALOG_FILE ({source}): ") for p in problems)
    assert list((tmp_path / "tmp").iterdir()) == []
