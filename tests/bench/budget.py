"""The performance budget: the service's instructions per new stream and per relayed event,
as ratios to the bare aiohttp relay's, held to the figures committed in budgets.toml.

    python -m tests.bench.budget --check            # count, compare, exit 1 over budget (.ci/run)
    python -m tests.bench.budget --check --runs 10  # ten counts: each checked, and their spread
    python -m tests.bench.budget --record           # write the counted ratios into budgets.toml

Counted by valgrind as tests/bench/instructions.py counts (its workload, smaller: the file's
`[workload]`), for the bare relay, the service at the default level (`LOG_LEVEL=info`) and the
service in production's configuration (tests/bench/production.py: PostgreSQL store,
multiprocess metrics, JSON lines), the service with traffic contracts on, enforcing, against
a throwaway Redis (instructions.traffic_contracts_environ), and the service with the fleet-wide
stream cap on (`STREAM_CAP_SCOPE=fleet` against a throwaway Redis on loopback: a lease taken and
released per new stream), all in one run on the same fakes. A ratio, not a count,
is budgeted: a new CPython or aiohttp moves both relays' counts together and leaves the
ratio where it was (docs/performance.md). `--check` fails when a ratio exceeds its budget by
more than the file's margin, and says which; the margin is there for the counts' spread
between runs on one tree (docs/performance.md, "Current figures and budgets"). A ratio
well under its budget is reported too: lowering the budget keeps the gain.

Raising a budget is a commit of budgets.toml that says why. `--record` writes every budget
from this run (the median of --runs), dated, with the commit measured on; the margin and
workload stay as they are. About a minute and a half on the 2-core development machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from .instructions import (
    BARE,
    Figures,
    Workload,
    counting_run,
    fleet_cap_redis,
    require_valgrind,
    traffic_contracts_environ,
)
from .open_streams import say, table
from .procs import terminate_on_sigterm
from .targets import REPO_ROOT

BUDGET_FILE = Path(__file__).resolve().with_name("budgets.toml")
# The targets a budget can name, and the counts.
SERVICE = "service"
PRODUCTION = "production"
# The service as SERVICE, with traffic contracts on against a throwaway Redis, enforcing: each
# new stream pays the check (its one round trip, which reserves the request) and nothing else,
# since the bench's streams end before a usage chunk. Observing, each would also add a share of
# a count flush, which depends on how many requests fall into one flush interval: the timing,
# not the code, and too uneven for a budget.
CONTRACTS = "traffic-contracts"
FLEET_CAP = "fleet cap"
TARGETS = (SERVICE, PRODUCTION, CONTRACTS, FLEET_CAP)
COUNTS = {"stream": "per new stream", "event": "per event"}


@dataclass(frozen=True)
class Budget:
    target: str
    count: str  # a key of COUNTS
    ratio: float  # instructions / the bare relay's
    measured_on: str
    commit: str
    why: str

    @property
    def label(self) -> str:
        return f"{self.target}, {COUNTS[self.count]}"


@dataclass(frozen=True)
class BudgetFile:
    margin_percent: float
    workload: Workload
    budgets: tuple[Budget, ...]

    @classmethod
    def read(cls, path: Path) -> BudgetFile:
        data = tomllib.loads(path.read_text())
        work = data["workload"]
        budgets = tuple(Budget(b["target"], b["count"], float(b["ratio"]), b["measured_on"], b["commit"], b.get("why", ""))
                        for b in data["budget"])
        for budget in budgets:
            if budget.target not in TARGETS or budget.count not in COUNTS:
                raise SystemExit(f"{path}: unknown budget {budget.target!r}/{budget.count!r}")
        workload = Workload(tuple(COUNTS), int(work["requests"]), int(work["streams"]), int(work["events"]),
                            float(work["gap"]))
        return cls(float(data["margin_percent"]), workload, budgets)

    def limit(self, budget: Budget) -> float:
        return budget.ratio * (1 + self.margin_percent / 100)


@dataclass(frozen=True)
class Run:
    """One count of every target: their figures by name."""

    figures: dict[str, Figures]

    def ratio(self, target: str, count: str) -> float:
        ours, bare = self.figures[target], self.figures[BARE]
        if count == "stream":
            assert ours.per_stream is not None and bare.per_stream is not None
            return ours.per_stream / bare.per_stream
        assert ours.per_event is not None and bare.per_event is not None
        return ours.per_event / bare.per_event

    def instructions(self, target: str, count: str) -> float:
        figures = self.figures[target]
        value = figures.per_stream if count == "stream" else figures.per_event
        assert value is not None
        return value


def count_once(workload: Workload, targets: set[str]) -> Run:
    """The bare relay and each of `targets`, counted in one run on the same fakes."""
    work_dir = Path(tempfile.mkdtemp(prefix="mlpa-budget-"))
    figures: dict[str, Figures] = {}
    with ExitStack() as stack:
        run = stack.enter_context(counting_run(work_dir, workload))
        figures[BARE] = run.bare()
        if SERVICE in targets:
            figures[SERVICE] = run.service(SERVICE, lambda port: run.service_env(port, extra={"LOG_LEVEL": "info"}))
        if CONTRACTS in targets:
            contracts = stack.enter_context(traffic_contracts_environ())
            enforcing = {"LOG_LEVEL": "info", **contracts, "TRAFFIC_CONTRACT_REJECT_OVER_CONTRACT": "true"}
            figures[CONTRACTS] = run.service(CONTRACTS, lambda port: run.service_env(port, extra=enforcing))
        if PRODUCTION in targets:
            from .production import production_configuration

            production = stack.enter_context(production_configuration(work_dir))
            figures[PRODUCTION] = run.service(
                PRODUCTION, lambda port: production.environ(port, run.upstream_port, run.fxa_port))
        if FLEET_CAP in targets:
            redis_env = stack.enter_context(fleet_cap_redis())
            figures[FLEET_CAP] = run.service(
                FLEET_CAP, lambda port: run.service_env(port, extra={"LOG_LEVEL": "info", **redis_env}))
    shutil.rmtree(work_dir, ignore_errors=True)
    return Run(figures)


def check(budgets: BudgetFile, runs: Sequence[Run]) -> bool:
    """Print every budget against the runs; True when no run exceeds a budget's limit."""
    margin = budgets.margin_percent
    rows, within = [], True
    for budget in budgets.budgets:
        ratios = [run.ratio(budget.target, budget.count) for run in runs]
        counts = [run.instructions(budget.target, budget.count) for run in runs]
        bare = [run.instructions(BARE, budget.count) for run in runs]
        worst = max(ratios)
        limit = budgets.limit(budget)
        if worst > limit:
            verdict, within = f"OVER by {100 * (worst / budget.ratio - 1):.1f} %", False
        elif worst < budget.ratio / (1 + margin / 100):
            verdict = f"under by {100 * (1 - worst / budget.ratio):.1f} %: lower the budget?"
        else:
            verdict = "within"
        spread = f"{min(ratios):.3f}-{max(ratios):.3f}" if len(runs) > 1 else f"{worst:.3f}"
        rows.append([budget.label, f"{statistics.median(counts) / 1000:.2f} k", f"{statistics.median(bare) / 1000:.2f} k",
                     spread, f"{budget.ratio:.3f} ({budget.measured_on}, {budget.commit})", f"{limit:.3f}", verdict])
    say("\n" + table(["budget", "service", "bare relay", "ratio" + (f", {len(runs)} runs" if len(runs) > 1 else ""),
                      "budget (measured on, commit)", f"limit (+{margin:g} %)", "verdict"], rows))
    if len(runs) > 1:
        say("\nspread of the ratios over the runs (max/min - 1): " + ", ".join(
            f"{budget.label} {100 * (max(r) / min(r) - 1):.2f} %"
            for budget in budgets.budgets
            for r in [[run.ratio(budget.target, budget.count) for run in runs]]))
    return within


def head_commit() -> str:
    done = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def render(budgets: BudgetFile, runs: Sequence[Run], why: str) -> str:
    """budgets.toml with every budget measured anew (the median of the runs)."""
    today, commit = datetime.date.today().isoformat(), head_commit()
    workload = budgets.workload
    lines = [
        "# The performance budget: the service's instructions per new stream and per relayed event",
        "# as ratios to the bare aiohttp relay's (valgrind; tests/bench/budget.py, docs/performance.md).",
        "# .ci/run fails when a ratio exceeds its budget by more than margin_percent.",
        "# Raising a budget is a commit of this file that says why (`why` below, and the message);",
        "# `python -m tests.bench.budget --record --why TEXT` writes it from a fresh count.",
        "",
        "# Larger than the ratios' spread over runs of one tree (docs/performance.md, \"Current",
        "# figures and budgets\"), smaller than the 5 % an added cost must not slip through with.",
        f"margin_percent = {budgets.margin_percent:g}",
        "",
        "# What each target is counted on (tests/bench/instructions.py): new streams counted, and",
        "# streams held open x content events each, one upstream write per `gap` seconds.",
        "[workload]",
        f"requests = {workload.requests}",
        f"streams = {workload.streams}",
        f"events = {workload.events}",
        f"gap = {workload.gap:g}",
    ]
    for budget in budgets.budgets:
        ratios = [run.ratio(budget.target, budget.count) for run in runs]
        counts = [run.instructions(budget.target, budget.count) for run in runs]
        bare = [run.instructions(BARE, budget.count) for run in runs]
        lines += [
            "",
            "[[budget]]",
            f'target = "{budget.target}"',
            f'count = "{budget.count}"',
            f"ratio = {statistics.median(ratios):.3f}",
            f"# k instructions {COUNTS[budget.count]} when measured: {statistics.median(counts) / 1000:.2f} "
            f"(bare relay {statistics.median(bare) / 1000:.2f})",
            f'measured_on = "{today}"',
            f'commit = "{commit}"',
            f"why = {json.dumps(why)}",
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.budget", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 when a ratio exceeds its budget by more than the margin")
    mode.add_argument("--record", action="store_true", help="write the counted ratios into the budget file")
    parser.add_argument("--runs", type=int, default=1, help="count this many times (the spread; --record takes the median)")
    parser.add_argument("--why", default="", help="with --record: why the budgets change (kept in the file)")
    parser.add_argument("--file", type=Path, default=BUDGET_FILE)
    args = parser.parse_args(argv)
    if args.record and not args.why:
        parser.error("--record needs --why: a budget that changes says why")
    require_valgrind()
    terminate_on_sigterm()
    budgets = BudgetFile.read(args.file)
    started = time.monotonic()
    targets = {budget.target for budget in budgets.budgets}
    runs = []
    for index in range(args.runs):
        run_started = time.monotonic()
        runs.append(count_once(budgets.workload, targets))
        say(f"run {index + 1}/{args.runs}: " + ", ".join(
            f"{budget.label} {runs[-1].ratio(budget.target, budget.count):.3f}" for budget in budgets.budgets)
            + f" ({time.monotonic() - run_started:.0f} s)")
    within = check(budgets, runs)
    say(f"\n{time.monotonic() - started:.0f} s")
    if args.record:
        args.file.write_text(render(budgets, runs, args.why))
        say(f"budgets written to {args.file}: commit it with the reason")
        return 0
    if not within:
        say("over budget: a change made the service cost more per new stream or per event, relative to the bare "
            "relay. Find it (python -m tests.bench.instructions --keep-dumps DIR, callgrind_annotate) or raise the "
            "budget in a commit that says why.")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
