"""Wait reasons written many jobs to a transaction, on a real etcd (issue 33): the group commit nests
up to 64 transactions in one request, and etcd leaves each nested one only what the request's own
ops leave of its 128 (`WAIT_WRITES_PER_TXN`). A run of wait reasons nested beside 63 others must
still be taken, and what etcdctl reads back must be what the store wrote."""

from __future__ import annotations

import asyncio
import subprocess
import zlib

from federation.runtime.etcd_process import EtcdProcess, etcdctl_binary
from federation.store.group_commit import DEFAULT_MAX_BATCH
from federation.store.job_store import WAIT_WRITES_PER_TXN, WAITS, KvStore, encode_wait_reasons
from federation.store.kv_etcd import EtcdKv
from placement.model import ClusterName, GpuType, JobId, WaitCode, WaitReason

REASONS = tuple(
    WaitReason(
        WaitCode.INSUFFICIENT_CAPACITY,
        f"needs 1 x 8 GPUs of A100; cluster c{c:02d} has 0 free, at most 0 on one node",
        cluster=ClusterName(f"c{c:02d}"),
        gpu_type=GpuType("A100"),
        needed_gpus=8,
        free_gpus=0,
    )
    for c in range(50)
)


async def test_full_runs_nested_as_the_group_commit_nests_them_are_taken(
    etcd_kv: EtcdKv, etcd_process: EtcdProcess
) -> None:
    store = KvStore(etcd_kv, compress_wait_reasons=True)
    value = encode_wait_reasons(REASONS, compressed=True)
    runs = [
        [(JobId(f"r{r:02d}-{n:02d}"), value) for n in range(WAIT_WRITES_PER_TXN)]
        for r in range(DEFAULT_MAX_BATCH)
    ]
    # All at once: the group commit puts as many of them into one request as it may.
    await asyncio.gather(*(store.put_encoded_wait_reasons(run) for run in runs))
    listed = await store.list_wait_reasons()
    assert len(listed) == WAIT_WRITES_PER_TXN * DEFAULT_MAX_BATCH
    assert set(listed.values()) == {REASONS}
    # etcd's own client reads the compressed list the store wrote.
    raw = (
        await asyncio.to_thread(
            subprocess.run,
            [
                str(etcdctl_binary()),
                f"--endpoints={etcd_process.endpoint}",
                "get",
                "--print-value-only",
                (WAITS + b"r63-63").decode(),
            ],
            capture_output=True,
            check=True,
        )
    ).stdout.rstrip(b"\n")
    assert zlib.decompress(raw) == zlib.decompress(value)
    # And deletes in the same shape.
    await asyncio.gather(
        *(store.put_encoded_wait_reasons([(job_id, None) for job_id, _ in run]) for run in runs)
    )
    assert await store.list_wait_reasons() == {}
