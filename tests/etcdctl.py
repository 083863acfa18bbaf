"""etcdctl as an independent judge of an etcd's size and history: the binary shipped with the etcd
in use, asked over loopback, so what the tests and the soak read is etcd's own account, not ours."""

from __future__ import annotations

import base64
import json
import re
import subprocess
from dataclasses import dataclass

from federation.runtime.etcd_process import etcdctl_binary


@dataclass(frozen=True, slots=True)
class EtcdStatus:
    # The bbolt file's size (what the quota counts), and the part of it holding live data.
    db_size_bytes: int
    db_size_in_use_bytes: int
    revision: int


def etcdctl(endpoint: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [str(etcdctl_binary()), f"--endpoints={endpoint}", "--command-timeout=10s", *args],
            check=check,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.CalledProcessError as error:
        # The exit status alone does not say why (a timeout, a message too large, etcd gone): etcdctl
        # says it on stderr, and a failed recount must carry that into the traceback.
        error.add_note(f"etcdctl stderr: {error.stderr.strip()[-2000:]}")
        raise


def endpoint_status(endpoint: str) -> EtcdStatus:
    """`etcdctl endpoint status -w json`: one member's dbSize, dbSizeInUse and revision."""
    (entry,) = json.loads(etcdctl(endpoint, "endpoint", "status", "-w", "json").stdout)
    status = entry["Status"]
    return EtcdStatus(
        db_size_bytes=int(status["dbSize"]),
        db_size_in_use_bytes=int(status.get("dbSizeInUse", status["dbSize"])),
        revision=int(status["header"]["revision"]),
    )


def compacted_past(endpoint: str, revision: int, key: str = "/") -> bool:
    """Whether etcd has compacted its history past `revision`: a read at it is refused."""
    done = etcdctl(endpoint, "get", key, f"--rev={revision}", check=False)
    if done.returncode == 0:
        return False
    if "compacted" in done.stderr:
        return True
    raise RuntimeError(f"etcdctl get --rev={revision} failed: {done.stderr.strip()}")


def count_keys(endpoint: str, prefix: str) -> int:
    """How many keys under `prefix`, counted by etcd (`--count-only`, which prints only as fields)."""
    out = etcdctl(endpoint, "get", prefix, "--prefix", "--count-only", "-w", "fields").stdout
    found = re.search(r'^"Count" : (\d+)$', out, re.MULTILINE)
    if found is None:
        raise RuntimeError(f"etcdctl printed no count: {out!r}")
    return int(found.group(1))


def keys(endpoint: str, prefix: str) -> list[str]:
    out = etcdctl(endpoint, "get", prefix, "--prefix", "--keys-only").stdout
    return [line for line in out.splitlines() if line]


def leases_of(endpoint: str, prefix: str) -> dict[str, int]:
    """The lease of each key under `prefix` that has one, by key (etcd's own answer, as JSON)."""
    found = json.loads(etcdctl(endpoint, "get", prefix, "--prefix", "--keys-only", "-w", "json").stdout)
    return {
        base64.b64decode(kv["key"]).decode(): int(kv["lease"])
        for kv in found.get("kvs", [])
        if kv.get("lease")
    }


def lease_alive(endpoint: str, lease: int) -> bool:
    """Whether etcd still holds the lease (`lease timetolive` says -1 for one revoked or expired)."""
    answer = json.loads(etcdctl(endpoint, "lease", "timetolive", format(lease, "x"), "-w", "json").stdout)
    return int(answer.get("ttl", -1)) > 0
