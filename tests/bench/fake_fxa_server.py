"""Run the project's fake Firefox Accounts server (knows `demo-token`) as its own process.

    python -m tests.bench.fake_fxa_server --port 9010
"""

from __future__ import annotations

import argparse
import asyncio

from mlpa_aiohttp.testing.fake_fxa import run_fake_fxa


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.fake_fxa_server")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    try:
        asyncio.run(run_fake_fxa("127.0.0.1", args.port, on_started=lambda url: print(url, flush=True)))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
