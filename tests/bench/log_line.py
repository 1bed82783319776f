"""Instructions per request log line, by renderer, counted by valgrind (callgrind).

    PYTHONPATH=. python -m tests.bench.log_line                # JSON and console, the whole line
    PYTHONPATH=. python -m tests.bench.log_line --steps        # and what each step of the path adds
    PYTHONPATH=. python -m tests.bench.log_line --baseline-ref main   # and the whole line at REF
    PYTHONPATH=. python -m tests.bench.log_line --steps --timed --lines 20000   # each step in µs (timeit), no valgrind

Every request writes one line at the default level (INFO), so a line's cost is a new
stream's cost (docs/performance.md, round 8). The line here is a chat request's: the fields
`request_context`, the auth step, the relay and its outcome bind, then `log.info("request",
...)` as the middleware writes it, through `configure_logging`'s chain and handler to
/dev/null. Each figure is the difference between a run of --lines lines and a run of 100,
divided by the difference: start-up cancels out. `--steps` builds the chain one step at a
time (the last processor hands the event to a writer that does nothing until the real
`EventWriter` and handler come in); each row's increase is that step's cost.
`--baseline-ref` writes the same line with the package from REF's tree (the whole line
only: the steps are this tree's). `--timed` times each row instead, in a process of its own
(`timeit`, the best of 7 rounds of --lines lines): a hot loop's µs, smaller than the same
step costs under load, but in the unit a profile of the service reads.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import timeit
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .instructions import counted_instructions
from .open_streams import export_tree, say, table
from .targets import PYTHON, REPO_ROOT, python_env

BASE_LINES = 100
# The child imports the package from this tree when set (--baseline-ref).
PACKAGE_TREE = "MLPA_LOG_LINE_PACKAGE_TREE"

# (label, how the logger is built): the rows of --steps, each one step more than the last.
STEPS = (
    ("structlog's bound logger and chain, nothing in it", "structlog"),
    ("+ drop_below_level", "level"),
    ("+ the request's fields (log_context.merge_fields)", "merge"),
    ("+ Stamp (level, logger, time)", "stamp"),
    ("+ scrub (redaction, escaping)", "scrub"),
    ("+ EventWriter: the record, Logger.handle, a handler that does nothing", "record"),
    ("+ LineFormatter, JSON", "format-json"),
    ("+ LineFormatter, console (instead of JSON)", "format-console"),
    ("the whole line, JSON, StreamHandler to /dev/null", "json"),
    ("the whole line, console, StreamHandler to /dev/null", "console"),
)


def bind_a_chat_requests_fields() -> None:
    from mlpa_aiohttp.observability import log_context

    log_context.begin(request_id="3eab17f1016410953341b52ebe041752", method="POST", route="/v1/chat/completions",
                      service_type="ai", purpose="-", session_id="N/A", user_agent="curl/7.88.1")
    log_context.bind(model="gpt-oss-120b")
    log_context.bind(user="demo-user:ai", service_type="ai", purpose="-", auth_method="fxa")
    log_context.bind(result="success", completion_seconds=1.0072, prompt_tokens=7, completion_tokens=20,
                     tool_calls=0, tool_names=[], litellm_backend="https://api.fake-provider.test/v1",
                     litellm_fallbacks=0, litellm_retries=0, litellm_duration_seconds=0.0125,
                     litellm_cost_usd=0.00012)


def logger_for(step: str) -> Any:
    import structlog

    from mlpa_aiohttp.observability import logging as lines

    if step in ("json", "console"):
        lines.configure_logging(level="INFO", json=step == "json")
        logging.getLogger().handlers[0].setStream(open(os.devnull, "w"))  # noqa: SIM115 - for the process's life
        return structlog.get_logger("mlpa_aiohttp.request")

    class WritesNothing:
        name = "mlpa_aiohttp.request"

        def isEnabledFor(self, level: int) -> bool:  # noqa: N802
            return True

        def info(self, event: Any) -> None:
            pass

    # The configured chain without its hand-over to the writer: drop_below_level,
    # merge_fields, Stamp, scrub; a step's row runs the chain up to and with it.
    chain = lines.event_chain()[:-1]
    order = ["structlog", "level", "merge", "stamp", "scrub"]
    if [getattr(step_, "__name__", type(step_).__name__) for step_ in chain] != [
            "drop_below_level", "merge_fields", "Stamp", "scrub"]:
        raise RuntimeError("the configured chain changed: update STEPS and `order` to match")
    writer: Any = WritesNothing()
    if step in order:
        chain = chain[: order.index(step)]
    else:
        stdlib_logger = logging.getLogger("mlpa_aiohttp.request")
        stdlib_logger.setLevel(logging.INFO)
        stdlib_logger.propagate = False
        handler: logging.Handler
        if step == "record":
            handler = logging.NullHandler()
        else:
            class FormatsOnly(logging.Handler):
                def emit(self, record: logging.LogRecord) -> None:
                    self.format(record)

            handler = FormatsOnly()
            handler.setFormatter(lines.stdlib_formatter(json=step == "format-json"))
        stdlib_logger.handlers = [handler]
        writer = lines.EventWriter(stdlib_logger)
    structlog.configure(processors=[*chain, lines.hand_to_writer], logger_factory=lambda *_: writer,
                        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO), cache_logger_on_first_use=True)
    return structlog.get_logger("mlpa_aiohttp.request")


def write_lines(step: str, count: int) -> None:
    """The child: build the step's logger, then write `count` request lines."""
    tree = os.environ.get(PACKAGE_TREE)
    if tree:
        sys.path.insert(0, tree)
    import mlpa_aiohttp

    if tree and not mlpa_aiohttp.__file__.startswith(tree):  # type: ignore[union-attr]
        raise RuntimeError(f"the package came from {mlpa_aiohttp.__file__}, not {tree}")
    log = logger_for(step)
    bind_a_chat_requests_fields()
    for _ in range(count):
        log.info("request", status=200, duration_ms=1008.16, path="/v1/chat/completions")


def time_lines(step: str, count: int) -> None:
    """The child of --timed: build the step's logger, print µs per line, the best of 7."""
    log = logger_for(step)
    bind_a_chat_requests_fields()
    rounds = timeit.repeat(
        lambda: log.info("request", status=200, duration_ms=1008.16, path="/v1/chat/completions"),
        number=count, repeat=7)
    print(f"{1e6 * min(rounds) / count:.3f}")


def timed(step: str, lines: int) -> float:
    """µs per line of the step, in a process of its own (loggers are configured per process)."""
    done = subprocess.run([PYTHON, "-m", "tests.bench.log_line", "--child-timed", step, "--lines", str(lines)],
                          env=python_env(), cwd=str(REPO_ROOT), check=True, capture_output=True, text=True, timeout=600)
    return float(done.stdout.split()[-1])


def counted(step: str, lines: int, work_dir: Path, tree: Path | None) -> int:
    out = work_dir / f"callgrind.{step}.{lines}"
    env = python_env()
    if tree is not None:
        env[PACKAGE_TREE] = str(tree)
    subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", PYTHON, "-m", "tests.bench.log_line",
         "--child", step, "--lines", str(lines)],
        env=env, cwd=str(REPO_ROOT), check=True, capture_output=True, timeout=600,
    )
    return counted_instructions(out)


def per_line(step: str, lines: int, work_dir: Path, tree: Path | None = None) -> float:
    return (counted(step, lines, work_dir, tree) - counted(step, BASE_LINES, work_dir, tree)) / (lines - BASE_LINES)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.log_line", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=1100)
    parser.add_argument("--steps", action="store_true", help="also each step of the path")
    parser.add_argument("--baseline-ref", help="also the whole line with the package at this commit")
    parser.add_argument("--timed", action="store_true", help="µs per line (timeit) instead of instructions")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-timed", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        write_lines(args.child, args.lines)
        return 0
    if args.child_timed:
        time_lines(args.child_timed, args.lines)
        return 0
    if args.timed:
        if args.baseline_ref:
            sys.exit("--timed measures this tree only")
        rows = []
        for label, step in STEPS if args.steps else STEPS[-2:]:
            figure = timed(step, args.lines)
            say(f"  {label:<72} {figure:7.2f} µs")
            rows.append([label, f"{figure:.2f}"])
        say("\n" + table(["path", "µs per line (hot loop)"], rows))
        return 0
    if args.lines <= BASE_LINES:
        sys.exit(f"--lines must be more than {BASE_LINES}")
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is needed")
    work_dir = Path(tempfile.mkdtemp(prefix="mlpa-log-line-"))
    steps = STEPS if args.steps else STEPS[-2:]
    rows = []
    for label, step in steps:
        figure = per_line(step, args.lines, work_dir)
        say(f"  {label:<72} {figure / 1000:7.1f} k")
        rows.append([label, f"{figure / 1000:.1f}"])
    if args.baseline_ref:
        tree = export_tree(args.baseline_ref, work_dir)
        for label, step in STEPS[-2:]:
            figure = per_line(step, args.lines, work_dir, tree)
            label = f"{label}, at {args.baseline_ref}"
            say(f"  {label:<72} {figure / 1000:7.1f} k")
            rows.append([label, f"{figure / 1000:.1f}"])
    say("\n" + table(["path", "k instructions per line"], rows))
    shutil.rmtree(work_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
