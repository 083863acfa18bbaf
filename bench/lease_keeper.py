"""What the lease keeper's thread costs beside a busy server loop: its wake-ups, by its etcd client.

The keeper refreshes the leader's lease from a thread of its own (`federation.scheduling.lease_keeper`).
With an asyncio etcd client there, gRPC's one completion queue a process woke the thread for every
gRPC completion of the process; with the blocking client (`federation.store.kv_etcd_lease`) it wakes
for its own calls only. This runs, in one process against a local etcd, the server's loop making
etcd puts (16 in flight) while a keeper-like thread refreshes a lease once a second through either
client, and counts the thread's context switches (the kernel's count) and the process's CPU per put.

    python bench/lease_keeper.py [--quick] [--seconds S]

Prints, per client, `<client>_thread_switches_per_s` and `<client>_cpu_us_per_put`, then the ratio
of the asyncio client's wake-ups to the blocking one's.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from federation.runtime.etcd_process import EtcdProcess
from federation.scheduling.lease_keeper import LeaseClient
from federation.store.kv_etcd import EtcdKv
from federation.store.kv_etcd_channel import EndpointClient
from federation.store.kv_etcd_lease import BlockingLeaseClient

IN_FLIGHT = 16


def _switches(native_id: int) -> int:
    status = Path(f"/proc/self/task/{native_id}/status").read_text()
    return sum(
        int(line.split()[1])
        for line in status.splitlines()
        if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"))
    )


def _asyncio_twin(kv: EtcdKv) -> LeaseClient:
    """What the keeper used before: an asyncio client of the same members, made in its thread."""
    return EtcdKv(
        [EndpointClient(c.endpoint, tls=None, timeout_s=5.0, options={}) for c in kv.endpoint_clients], 5.0
    )


async def _one(kv: EtcdKv, make: Callable[[EtcdKv], LeaseClient], seconds: float) -> tuple[float, float]:
    lease = await kv.grant_lease(10)
    ready, stop = threading.Event(), threading.Event()
    native: list[int] = []

    def keeper() -> None:
        async def refresh() -> None:
            client = make(kv)
            try:
                await client.keepalive(lease)  # a first call, as the keeper makes one a second
                ready.set()
                while not stop.is_set():
                    await asyncio.sleep(1.0)
                    await client.keepalive(lease)
                    await client.get(b"/bench-lease-keeper")
            finally:
                await client.close()

        native.append(threading.get_native_id())
        asyncio.run(refresh())

    thread = threading.Thread(target=keeper, name="bench-lease-keeper")
    thread.start()
    await asyncio.to_thread(ready.wait)
    before, cpu0, began = _switches(native[0]), time.process_time(), time.monotonic()
    puts = 0
    while time.monotonic() - began < seconds:
        batch: list[Awaitable[object]] = [
            kv.put(f"/bench/{puts + i}".encode(), b"v") for i in range(IN_FLIGHT)
        ]
        await asyncio.gather(*batch)
        puts += IN_FLIGHT
    took = time.monotonic() - began
    switched, cpu = _switches(native[0]) - before, time.process_time() - cpu0
    stop.set()
    await asyncio.to_thread(thread.join)
    await kv.revoke_lease(lease)
    return switched / took, 1e6 * cpu / puts


async def _run(endpoint: str, seconds: float, turns: int) -> None:
    kv = await EtcdKv.connect(endpoint)
    figures: dict[str, list[tuple[float, float]]] = {"asyncio": [], "blocking": []}
    try:
        for _ in range(turns):  # in turns, so that the machine's load falls on both alike
            figures["asyncio"].append(await _one(kv, _asyncio_twin, seconds))
            figures["blocking"].append(await _one(kv, BlockingLeaseClient.twin_of, seconds))
    finally:
        await kv.close()
    medians = {}
    for name, runs in figures.items():
        switches = sorted(r[0] for r in runs)[len(runs) // 2]
        cpu = sorted(r[1] for r in runs)[len(runs) // 2]
        medians[name] = switches
        print(f"runs_{name}: " + ", ".join(f"{s:.0f} switches/s {c:.0f} us/put" for s, c in runs))
        print(f"{name}_thread_switches_per_s: {switches:.0f} /s")
        print(f"{name}_cpu_us_per_put: {cpu:.1f} us")
    print(
        f"thread_wakeups_ratio_asyncio_to_blocking: {medians['asyncio'] / max(medians['blocking'], 0.1):.0f} x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one turn of 3 s each")
    parser.add_argument("--seconds", type=float, default=None, help="seconds of puts a run")
    args = parser.parse_args()
    seconds = args.seconds or (3.0 if args.quick else 8.0)
    turns = 1 if args.quick else 3
    with tempfile.TemporaryDirectory() as data, EtcdProcess(Path(data)) as etcd:
        asyncio.run(_run(f"{etcd.host}:{etcd.client_port}", seconds, turns))


if __name__ == "__main__":
    main()
