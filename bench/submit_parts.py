"""Parts of a submission's CPU, each timed alone in this process (issue 33).

No etcd and no gRPC server: what one submission's own pieces cost, for A/B runs against another tree
(run this file from a worktree of it: it imports the tree it sits in).

- `etcd_txn_build_us`: a submission's etcd transaction (2 compares, 2 puts, 2 reads) as a
  protobuf request (`kv_etcd._txn_to_pb`);
- `job_to_pb_us`: a reply's job message for a queued job with two phase events (`convert.job_to_pb`);
- `log_line_us`: the `job_submitted` line, JSON, written to a file (`federation.logs`);
- `parse_manifest_us`: bench/submit.py's manifest (as its client sends it, JSON) read and validated;
- `submit_handler_us`: a whole `JobService.SubmitJob` as gRPC calls it, 8 in flight, over the
  in-memory store (the real `KvStore`, group commit and job cache over a `MemoryKv`): the per-call
  wrapper (authentication, metrics), the checks, the record's encoding, the log line and the reply.
  Neither gRPC nor etcd: what the servicer's own Python costs a submission, in one process.

    python bench/submit_parts.py            # 5 rounds of 20,000
    python bench/submit_parts.py --quick    # 3 rounds of 5,000

Each figure is the median of the rounds, in process CPU (`time.process_time`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import structlog  # noqa: E402

from bench.submit import MANIFEST  # noqa: E402
from federation.api import convert  # noqa: E402
from federation.api.service import Ctx  # noqa: E402
from federation.api.v1 import gpufed_pb2 as pb  # noqa: E402
from federation.logs import configure_logging  # noqa: E402
from federation.spec.manifest_text import wire_manifest  # noqa: E402
from federation.spec.priorities import DEFAULT_PRIORITY_CLASSES  # noqa: E402
from federation.spec.training_job import parse_manifest  # noqa: E402
from federation.store import kv_etcd  # noqa: E402
from federation.store.job_cache import JobCache  # noqa: E402
from federation.store.job_store import KvStore  # noqa: E402
from federation.store.jobs import PhaseEvent  # noqa: E402
from federation.store.kv import Compare, Get, Put  # noqa: E402
from federation.store.kv_memory import MemoryKv  # noqa: E402
from federation.store.records import Role, TenantRecord, UserRecord  # noqa: E402
from placement.model import JobPhase, TenantId  # noqa: E402
from tests.job_builder import build_job  # noqa: E402
from tests.unit.job_service import job_service  # noqa: E402


def timed(one: Callable[[], object], n: int, rounds: int) -> float:
    """Median µs of `one` over `rounds` rounds of `n` calls."""
    figures = []
    for _ in range(rounds):
        began = time.process_time()
        for _ in range(n):
            one()
        figures.append(1e6 * (time.process_time() - began) / n)
    return statistics.median(figures)


class _Context:
    """What `CallHandlers` reads of a gRPC call's context."""

    def __init__(self, token: str) -> None:
        self._metadata = (("authorization", f"Bearer {token}"),)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return "ipv4:127.0.0.1:50000"

    async def abort(self, code: object, details: str) -> None:
        raise RuntimeError(f"submission refused: {code} {details}")


async def _submit_handler_us(n: int, rounds: int, in_flight: int = 8) -> float:
    """Median µs of process CPU a `SubmitJob`, `in_flight` at once (each round n submissions)."""
    store = KvStore(MemoryKv())
    # bench/submit.py's tenant, with room for every round's jobs in its queue and rate.
    await store.put_tenant(
        TenantRecord(TenantId("t0"), max_queued_jobs=10**9, submit_rate_per_s=1e9, submit_burst=10**9)
    )
    await store.put_user(UserRecord("u0", TenantId("t0"), Role.MEMBER))
    await store.put_token("token-u0", "u0")
    cache = JobCache(store)
    await cache.start()
    service = job_service(store, cache)
    # _Context has what the servicer reads (metadata, peer), not the rest of grpc's abstract
    # ServicerContext, so mypy cannot take it for one: this is the one place that says so.
    context = cast(Ctx, _Context("token-u0"))
    wire = wire_manifest(MANIFEST)
    counter = iter(range(10**12))

    async def submitter(count: int) -> None:
        for _ in range(count):
            request = pb.SubmitJobRequest(manifest=wire, idempotency_key=f"key-{next(counter):024d}")
            reply = await service.SubmitJob(request, context)
            assert reply.created

    try:
        await submitter(50)  # imports, the token's resolution and the tenant's first read
        figures = []
        for _ in range(rounds):
            began = time.process_time()
            await asyncio.gather(*(submitter(n // in_flight) for _ in range(in_flight)))
            figures.append(1e6 * (time.process_time() - began) / (in_flight * (n // in_flight)))
        return statistics.median(figures)
    finally:
        await cache.stop()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="3 rounds of 5,000")
    args = parser.parse_args()
    n, rounds = (5_000, 3) if args.quick else (20_000, 5)

    idem, key = b"/gpufed/idem/t1/0123456789abcdef", b"/gpufed/jobs/train-1a2b3c4d"
    compares = (Compare.absent(idem), Compare.absent(key))
    success = (Put(idem, b'{"schema":1,"job_id":"train-1a2b3c4d","digest":"d"}'), Put(key, b"x" * 1500))
    failure = (Get(idem), Get(key))
    txn_us = timed(lambda: kv_etcd._txn_to_pb(compares, success, failure), n, rounds)

    job = dataclasses.replace(
        build_job("train-1a2b3c4d"),
        events=(
            PhaseEvent(JobPhase.QUEUED, 1000.0, 1, "submitted"),
            PhaseEvent(JobPhase.ADMITTED, 1001.5, 1, ""),
        ),
    )
    pb_us = timed(lambda: convert.job_to_pb(job), n, rounds)

    saved_stderr, saved_config = sys.stderr, structlog.get_config()
    with tempfile.TemporaryFile("w") as out:
        sys.stderr = out
        try:
            configure_logging(json=True)
            log = structlog.get_logger("federation.api.service")
            log_us = timed(
                lambda: log.info("job_submitted", job_id="train-1a2b3c4d", tenant="t1", user="u1"), n, rounds
            )
        finally:
            sys.stderr = saved_stderr
            structlog.configure(**saved_config)

        wire = wire_manifest(MANIFEST)
        parse_us = timed(
            lambda: parse_manifest(wire, priority_classes=DEFAULT_PRIORITY_CLASSES.keys()), n, rounds
        )
        # The handler's log lines go to the same file as the timed line's.
        sys.stderr = out
        try:
            configure_logging(json=True)
            handler_us = asyncio.run(_submit_handler_us(n, rounds))
        finally:
            sys.stderr = saved_stderr
            structlog.configure(**saved_config)

    print(f"rounds: {rounds} of {n}")
    print(f"etcd_txn_build_us: {txn_us:.2f} us")
    print(f"job_to_pb_us: {pb_us:.2f} us")
    print(f"log_line_us: {log_us:.2f} us")
    print(f"parse_manifest_us: {parse_us:.2f} us")
    print(f"submit_handler_us: {handler_us:.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
