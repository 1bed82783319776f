"""What request validation costs per request: this tree against a baseline, in one run.

The baseline revision's package is exported under another name (`mlpa_baseline`; its
validation modules import each other relatively) and imported next to `mlpa_aiohttp` in
this one interpreter. Each sample times a block of calls of one, then of the other
(alternating which goes first), so the shared machine's drift hits both sides of a pair
alike; the figure reported is the median over samples, and the ratio the median of the
per-pair ratios. Cases, per call:

* `chat`       - `models.parse_chat` on a typical chat body (6 messages, ~1.5 KiB, the
                 sampling fields Firefox sends) and the headers aiohttp hands the route;
* `chat_large` - the same with 200 messages (~50 KiB: a long conversation);
* `search`     - `models.parse_search` on a search body;
* `invalid`    - `parse_chat` answering a 422 (missing service-type, `stream: "yes"`).

    PYTHONPATH=. python -m tests.bench.validation_cost [--baseline-rev REV] [--samples 41]
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from multidict import CIMultiDict, CIMultiDictProxy

from mlpa_aiohttp import errors as current_errors
from mlpa_aiohttp import models as current_models

REPO = Path(__file__).resolve().parents[2]
# The last commit whose request models were written by hand.
DEFAULT_BASELINE = "10b6a872f659eb30151d50f4d1e79561fc343e87"


def _message(i: int) -> dict[str, str]:
    return {"role": "user" if i % 2 else "assistant", "content": "Summarise the page for me, please. " * 7}


def _chat(messages: int) -> bytes:
    body = {
        "model": "gpt-oss-120b",
        "stream": True,
        "temperature": 0.1,
        "top_p": 0.01,
        "max_completion_tokens": 1024,
        "messages": [_message(i) for i in range(messages)],
    }
    return json.dumps(body).encode()


HEADERS = CIMultiDictProxy(
    CIMultiDict(
        {
            "Host": "mlpa.example",
            "User-Agent": "Firefox/150.0",
            "Accept": "*/*",
            "Accept-Encoding": "gzip",
            "Content-Type": "application/json",
            "Content-Length": "1500",
            "Authorization": "Bearer " + "t" * 43,
            "service-type": "ai",
            "purpose": "chat",
            "session-id": "abc",
            "X-Geo-Country": "DE",
        }
    )
)
NO_SERVICE_TYPE = CIMultiDictProxy(CIMultiDict({k: v for k, v in HEADERS.items() if k != "service-type"}))
SMALL, LARGE = _chat(6), _chat(200)
SEARCH = json.dumps({"query": "firefox release notes", "max_results": 5}).encode()
INVALID = b'{"model": "m", "stream": "yes"}'


def calls(models: ModuleType, errors: ModuleType) -> dict[str, Callable[[], Any]]:
    def invalid() -> None:
        try:
            models.parse_chat(INVALID, NO_SERVICE_TYPE)
        except errors.RequestInvalid:
            return
        raise AssertionError("expected a 422")

    return {
        "chat": lambda: models.parse_chat(SMALL, HEADERS),
        "chat_large": lambda: models.parse_chat(LARGE, HEADERS),
        "search": lambda: models.parse_search(SEARCH, HEADERS),
        "invalid": invalid,
    }


def _per_call_us(call: Callable[[], Any], repeat: int) -> float:
    started = time.perf_counter()
    for _ in range(repeat):
        call()
    return (time.perf_counter() - started) / repeat * 1e6


def import_baseline(revision: str, into: Path) -> tuple[ModuleType, ModuleType]:
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, "mlpa_aiohttp"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    (into / "mlpa_aiohttp").rename(into / "mlpa_baseline")
    sys.path.insert(0, str(into))
    return importlib.import_module("mlpa_baseline.models"), importlib.import_module("mlpa_baseline.errors")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-rev", default=DEFAULT_BASELINE)
    parser.add_argument("--samples", type=int, default=41)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlpa-baseline-") as tmp:
        baseline_models, baseline_errors = import_baseline(args.baseline_rev, Path(tmp))
        baseline = calls(baseline_models, baseline_errors)
        current = calls(current_models, current_errors)
        print(f"baseline {args.baseline_rev[:12]} vs this tree, {args.samples} paired samples per case")
        print(f"{'case':<11} {'baseline us':>12} {'current us':>11} {'ratio':>6}  (ratio: median of per-pair ratios, IQR)")
        for case in baseline:
            old_call, new_call = baseline[case], current[case]
            repeat = max(20, int(0.02 / max(_per_call_us(old_call, 20) * 1e-6, 1e-7)))  # ~20 ms blocks
            for _ in range(3):  # warm both
                _per_call_us(old_call, repeat), _per_call_us(new_call, repeat)
            old_samples, new_samples = [], []
            for sample in range(args.samples):
                if sample % 2:
                    new_samples.append(_per_call_us(new_call, repeat))
                    old_samples.append(_per_call_us(old_call, repeat))
                else:
                    old_samples.append(_per_call_us(old_call, repeat))
                    new_samples.append(_per_call_us(new_call, repeat))
            ratios = sorted(n / o for n, o in zip(new_samples, old_samples))
            quartiles = statistics.quantiles(ratios, n=4)
            print(
                f"{case:<11} {statistics.median(old_samples):12.1f} {statistics.median(new_samples):11.1f} "
                f"{statistics.median(ratios):5.2f}x  ({quartiles[0]:.2f}-{quartiles[2]:.2f})",
                flush=True,
            )


if __name__ == "__main__":
    main()
