"""What listing etcd costs etcd itself, in pages of a fixed 1,000 keys (gpufed before) against pages
grown by size (`federation.store.kv_pages`), at a restart's scale (issue 19).

etcd 3.5 answers a range with a limit by walking its key index from the page's start to the
range's end (to count what is left), so fixed pages cost it about N²/2P index steps. Seeds a real
etcd as `bench/history.py` does (100,000 jobs, 90 % ended, and their ledger intervals), then lists
both prefixes with each strategy, alternated, and reads etcd's own CPU seconds from /proc.

    python bench/etcd_paging.py            # 100,000 jobs, 3 rounds
    python bench/etcd_paging.py --quick    # 30,000 jobs, 2 rounds (within a minute)

Ends with `figure_name: value unit` lines; the ratio is grown pages' etcd CPU over fixed pages'.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import history as seeding  # noqa: E402
from federation.history.sql_store import SqlHistoryStore  # noqa: E402
from federation.runtime.etcd_process import EtcdProcess  # noqa: E402
from federation.store.intervals import LEDGER_PREFIX  # noqa: E402
from federation.store.job_store import JOBS  # noqa: E402
from federation.store.kv import KeyValueStore  # noqa: E402
from federation.store.kv_etcd import EtcdKv  # noqa: E402
from federation.store.kv_pages import pages  # noqa: E402

FIXED_PAGE_KEYS = 1000


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def fixed_pages(kv: KeyValueStore, prefix: bytes) -> int:
    """The listing before: pages of 1,000 keys at the first page's revision."""
    page = await kv.range_prefix(prefix, limit=FIXED_PAGE_KEYS)
    revision, count = page.revision, len(page.kvs)
    while page.more and page.kvs:
        page = await kv.range_prefix(
            prefix, limit=FIXED_PAGE_KEYS, start=page.kvs[-1].key + b"\0", revision=revision
        )
        count += len(page.kvs)
    return count


async def grown_pages(kv: KeyValueStore, prefix: bytes) -> int:
    count = 0
    async with contextlib.aclosing(pages(kv, prefix)) as listing:
        async for page, _ in listing:
            count += len(page)
    return count


async def run(args: argparse.Namespace) -> dict[str, tuple[float, str]]:
    strategies: dict[str, Callable[[KeyValueStore, bytes], Awaitable[int]]] = {
        "fixed_1000": fixed_pages,
        "grown": grown_pages,
    }
    etcd_cpu: dict[str, list[float]] = {name: [] for name in strategies}
    wall: dict[str, list[float]] = {name: [] for name in strategies}
    with tempfile.TemporaryDirectory(prefix="gpufed-bench-paging-") as tmp_name:
        tmp = Path(tmp_name)
        dsn = f"sqlite:///{tmp / 'history.sqlite3'}"
        SqlHistoryStore.open(dsn).close()
        with EtcdProcess(tmp / "etcd") as etcd:
            pid = int(json.loads((tmp / "etcd" / "etcd.pid").read_text())["pid"])
            began = time.perf_counter()
            _, _, running = seeding.live_mix(args.jobs)
            await seeding.seed_live(
                etcd.endpoint, tmp / "state", seeding.restart_config(dsn, running), args.jobs
            )
            print(
                f"etcd seeded with {args.jobs} jobs and their intervals in {time.perf_counter() - began:.1f} s"
            )
            kv = await EtcdKv.connect(etcd.endpoint)
            try:
                counts: dict[str, tuple[int, int]] = {}
                for round_ in range(args.rounds):
                    order = list(strategies.items())
                    if round_ % 2:
                        order.reverse()
                    for name, list_all in order:
                        cpu_before, began = cpu_s(pid), time.perf_counter()
                        # Side by side, as a restart lists them.
                        got = await asyncio.gather(list_all(kv, JOBS), list_all(kv, LEDGER_PREFIX))
                        wall[name].append(time.perf_counter() - began)
                        etcd_cpu[name].append(cpu_s(pid) - cpu_before)
                        counts[name] = (got[0], got[1])
                        print(
                            f"  round {round_ + 1} {name:10s}: {got[0]} jobs, {got[1]} intervals; "
                            f"etcd CPU {etcd_cpu[name][-1]:.2f} s, wall {wall[name][-1]:.2f} s"
                        )
                if len(set(counts.values())) != 1:
                    raise SystemExit(f"the strategies listed different counts: {counts}")
            finally:
                await kv.close()
    fixed, grown = statistics.median(etcd_cpu["fixed_1000"]), statistics.median(etcd_cpu["grown"])
    return {
        "etcd_list_cpu_s_fixed_1000": (fixed, "s"),
        "etcd_list_cpu_s_grown": (grown, "s"),
        "list_wall_s_fixed_1000": (statistics.median(wall["fixed_1000"]), "s"),
        "list_wall_s_grown": (statistics.median(wall["grown"]), "s"),
        "etcd_list_cpu_ratio_grown_vs_fixed": (grown / fixed, "ratio"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="30,000 jobs, 2 rounds")
    parser.add_argument("--jobs", type=int, help="jobs seeded (100,000; quick 30,000)")
    parser.add_argument("--rounds", type=int, help="rounds of both strategies (3; quick 2)")
    args = parser.parse_args()
    args.jobs = args.jobs or (30_000 if args.quick else 100_000)
    args.rounds = args.rounds or (2 if args.quick else 3)
    figures = asyncio.run(run(args))
    print(f"jobs: {args.jobs}; medians of {args.rounds} rounds")
    for name, (value, unit) in figures.items():
        print(f"{name}: {value:.3f} {unit}")


if __name__ == "__main__":
    main()
