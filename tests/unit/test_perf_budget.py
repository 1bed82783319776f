"""The performance budget's file and verdicts (tests/bench/budget.py; the counts themselves
need valgrind and run in .ci/run, not here)."""

from __future__ import annotations

import datetime
import re

import pytest

from tests.bench.budget import BUDGET_FILE, COUNTS, TARGETS, Budget, BudgetFile, Run, check, render
from tests.bench.instructions import BARE, Figures, Workload


def test_the_committed_file_budgets_every_target_and_count_with_its_date_and_commit() -> None:
    budgets = BudgetFile.read(BUDGET_FILE)
    assert {(budget.target, budget.count) for budget in budgets.budgets} == {(t, c) for t in TARGETS for c in COUNTS}
    for budget in budgets.budgets:
        assert datetime.date.fromisoformat(budget.measured_on) <= datetime.date.today()
        assert re.fullmatch(r"[0-9a-f]{7,40}", budget.commit), budget
        assert budget.why.strip(), f"{budget.label}: a budget says why it is what it is"
        assert 0 < budget.ratio < 5


def test_the_margin_lets_no_five_percent_regression_through() -> None:
    margin = BudgetFile.read(BUDGET_FILE).margin_percent
    assert 0 < margin < 5


def budget_file(margin: float, ratio: float) -> BudgetFile:
    budget = Budget("service", "event", ratio, "2026-12-03", "abcdef0", "test")
    return BudgetFile(margin, Workload(), (budget,))


def run_at(service_per_event: float, bare_per_event: float = 50_000.0) -> Run:
    return Run({
        BARE: Figures(BARE, per_stream=1_000_000.0, per_event=bare_per_event),
        "service": Figures("service", per_stream=1_600_000.0, per_event=service_per_event),
    })


@pytest.mark.parametrize(
    ("service_per_event", "within"),
    [
        (25_000.0, True),  # at the budget
        (25_700.0, True),  # 2.8 % over: inside a 3 % margin
        (25_800.0, False),  # 3.2 % over
        (26_250.0, False),  # the 5 % the margin exists to catch
        (20_000.0, True),  # far under: reported, not failed
    ],
)
def test_a_ratio_fails_only_beyond_its_budget_and_margin(service_per_event: float, within: bool) -> None:
    assert check(budget_file(3.0, 0.5), [run_at(service_per_event)]) is within


def test_the_worst_of_several_runs_decides() -> None:
    runs = [run_at(25_000.0), run_at(26_250.0), run_at(25_100.0)]
    assert check(budget_file(3.0, 0.5), runs) is False


def test_a_ratio_is_the_service_over_the_bare_relay() -> None:
    # The bare relay got 10 % cheaper and the service did not: the ratio grew, and that fails.
    assert check(budget_file(3.0, 0.5), [run_at(25_000.0, bare_per_event=45_000.0)]) is False


def test_a_recorded_file_reads_back_with_the_runs_median_and_keeps_margin_and_workload(tmp_path) -> None:
    budgets = BudgetFile.read(BUDGET_FILE)
    runs = [run_at(per_event) for per_event in (24_000.0, 25_000.0, 26_000.0)]
    for run in runs:  # the file budgets production, the traffic contracts and the fleet cap too
        run.figures["production"] = Figures("production", per_stream=1_900_000.0, per_event=25_500.0)
        run.figures["traffic-contracts"] = Figures("traffic-contracts", per_stream=2_200_000.0, per_event=25_000.0)
        run.figures["fleet cap"] = Figures("fleet cap", per_stream=2_300_000.0, per_event=25_000.0)
    recorded = tmp_path / "budgets.toml"
    recorded.write_text(render(budgets, runs, "a test's reason"))
    read_back = BudgetFile.read(recorded)
    assert read_back.margin_percent == budgets.margin_percent
    assert read_back.workload == budgets.workload
    by_label = {budget.label: budget for budget in read_back.budgets}
    assert by_label["service, per event"].ratio == 0.5
    assert by_label["production, per new stream"].ratio == 1.9
    assert by_label["traffic-contracts, per new stream"].ratio == 2.2
    assert by_label["fleet cap, per new stream"].ratio == 2.3
    assert {budget.why for budget in read_back.budgets} == {"a test's reason"}
    assert all(budget.measured_on == datetime.date.today().isoformat() for budget in read_back.budgets)
