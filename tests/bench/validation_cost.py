"""What request validation costs per request: this tree against a baseline, in one run.

Each round starts one fresh interpreter per tree (baseline first in odd rounds, current
first in even ones, so drift of the shared machine hits both) and times, per call:

* `chat`       - `models.parse_chat` on a typical chat body (6 messages, ~1.5 KiB, the
                 sampling fields Firefox sends) and the headers aiohttp hands the route;
* `chat_large` - the same with 200 messages (~60 KiB: a long conversation);
* `search`     - `models.parse_search` on a search body;
* `invalid`    - `parse_chat` answering a 422 (missing service-type, `stream: "yes"`).

The baseline is a git revision exported to a temporary directory (default: the commit
before request models moved to pydantic). Prints each round's medians and, at the end, the
median of the per-round figures and of the ratios current / baseline.

    PYTHONPATH=. python -m tests.bench.validation_cost [--baseline-rev REV] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BASELINE = "10b6a872f659eb30151d50f4d1e79561fc343e87"
CASES = ("chat", "chat_large", "search", "invalid")

# Runs inside each child interpreter, with the tree under test first on sys.path.
_MEASURE = r"""
import json, statistics, sys, time
from multidict import CIMultiDict, CIMultiDictProxy
from mlpa_aiohttp.errors import RequestInvalid
from mlpa_aiohttp.models import parse_chat, parse_search

def message(i):
    return {"role": "user" if i % 2 else "assistant", "content": "Summarise the page for me, please. " * 7}

def chat(n):
    return json.dumps({"model": "gpt-oss-120b", "stream": True, "temperature": 0.1, "top_p": 0.01,
                       "max_completion_tokens": 1024, "messages": [message(i) for i in range(n)]}).encode()

headers = CIMultiDictProxy(CIMultiDict({
    "Host": "mlpa.example", "User-Agent": "Firefox/150.0", "Accept": "*/*", "Accept-Encoding": "gzip",
    "Content-Type": "application/json", "Content-Length": "1500", "Authorization": "Bearer " + "t" * 43,
    "service-type": "ai", "purpose": "chat", "session-id": "abc", "X-Geo-Country": "DE",
}))
bad_headers = CIMultiDictProxy(CIMultiDict({k: v for k, v in headers.items() if k != "service-type"}))

def invalid():
    try:
        parse_chat(b'{"model": "m", "stream": "yes"}', bad_headers)
    except RequestInvalid:
        return
    raise AssertionError("expected a 422")

small, large = chat(6), chat(200)
search = json.dumps({"query": "firefox release notes", "max_results": 5}).encode()
calls = {
    "chat": lambda: parse_chat(small, headers),
    "chat_large": lambda: parse_chat(large, headers),
    "search": lambda: parse_search(search, headers),
    "invalid": invalid,
}
result = {}
for name, call in calls.items():
    for _ in range(200):
        call()
    samples = []
    for _ in range(15):
        started = time.perf_counter()
        for _ in range(500):
            call()
        samples.append((time.perf_counter() - started) / 500 * 1e6)
    result[name] = statistics.median(samples)
import mlpa_aiohttp
result["tree"] = mlpa_aiohttp.__file__
print(json.dumps(result))
"""


def measure(tree: Path) -> dict[str, float]:
    code = f"import sys; sys.path.insert(0, {str(tree)!r})\n" + _MEASURE
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=300, cwd=tree)
    result = json.loads(out.stdout)
    # The editable install must not shadow the tree asked for.
    assert Path(result.pop("tree")).is_relative_to(tree), result
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-rev", default=DEFAULT_BASELINE)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlpa-baseline-") as tmp:
        baseline = Path(tmp)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.baseline_rev, "mlpa_aiohttp"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(baseline)], input=archive.stdout, check=True)
        figures: dict[str, dict[str, list[float]]] = {"baseline": {c: [] for c in CASES}, "current": {c: [] for c in CASES}}
        for round_no in range(1, args.rounds + 1):
            order = [("baseline", baseline), ("current", REPO)]
            if round_no % 2 == 0:
                order.reverse()
            seen = {}
            for label, tree in order:
                seen[label] = measure(tree)
                for case in CASES:
                    figures[label][case].append(seen[label][case])
            print(f"round {round_no} ({order[0][0]} first): " + ", ".join(
                f"{c} {seen['baseline'][c]:.1f} -> {seen['current'][c]:.1f} us" for c in CASES
            ), flush=True)
    print("\nmedian of rounds, us per call (baseline -> current, ratio of per-round ratios):")
    for case in CASES:
        old, new = figures["baseline"][case], figures["current"][case]
        ratio = statistics.median(n / o for n, o in zip(new, old))
        print(f"  {case:<11} {statistics.median(old):7.1f} -> {statistics.median(new):7.1f}  ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
