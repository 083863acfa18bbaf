"""etcd's own tools for `gpufed admin backup` and `restore`: etcdctl and etcdutl, beside the etcd in use.

A snapshot is etcd's maintenance snapshot (`etcdctl snapshot save`): one member's whole keyspace at
one revision, a consistent point-in-time copy with etcd's hash appended, which `etcdutl snapshot
restore` checks before it builds a new data dir. The binaries, not a client library, because they are
what an etcd operator already trusts and runs, and they stream the file to disk (aetcd's snapshot
holds one call's timeout over the whole download). Reads at the snapshot's revision (`get --rev`)
export the datasets beside it, from the same point in time.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from federation.errors import GpufedError
from federation.runtime.etcd_process import etcd_binary, etcdctl_binary

# A snapshot of etcd's 2 GiB quota streams in well under this on a local disk.
_SNAPSHOT_TIMEOUT_S = 600.0
_CALL_TIMEOUT_S = 60.0
# A member that is down is known within this; etcdctl's snapshot would otherwise wait out its whole
# command timeout (which bounds the download too) on one that never answers.
_DIAL_TIMEOUT_S = 2
_PROBE_TIMEOUT_S = 2.0


class EtcdToolFailed(GpufedError):
    """etcdctl or etcdutl failed; the message carries what it said."""


@dataclass(frozen=True, slots=True)
class EtcdAccess:
    """How to reach etcd as `gpufed serve` does: endpoints (comma-separated, as `--etcd` takes them)
    and, for TLS, the CA and the client certificate and key."""

    endpoints: str
    cacert: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def endpoint_list(self) -> list[str]:
        return [e.strip() for e in self.endpoints.split(",") if e.strip()]

    def flags(
        self, endpoints: Sequence[str] | None = None, *, timeout_s: float = _CALL_TIMEOUT_S
    ) -> list[str]:
        chosen = ",".join(endpoints if endpoints is not None else self.endpoint_list())
        out = [
            f"--endpoints={chosen}",
            f"--command-timeout={int(timeout_s)}s",
            f"--dial-timeout={_DIAL_TIMEOUT_S}s",
        ]
        if self.cacert is not None:
            out.append(f"--cacert={self.cacert}")
        if self.cert is not None and self.key is not None:
            out += [f"--cert={self.cert}", f"--key={self.key}"]
        return out


@dataclass(frozen=True, slots=True)
class SnapshotStatus:
    """`etcdutl snapshot status`: the revision the snapshot holds, its keys (etcd's internal ones
    included) and etcd's hash of its contents."""

    revision: int
    total_keys: int
    hash: int
    size_bytes: int


def etcdutl_binary() -> Path:
    beside = etcd_binary().with_name("etcdutl")
    if not beside.is_file():
        raise EtcdToolFailed(f"no etcdutl beside {etcd_binary()}: restore needs etcd's own restore tool")
    return beside


def _run(argv: list[str], what: str, timeout_s: float = _CALL_TIMEOUT_S) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as error:
        raise EtcdToolFailed(f"{what} did not finish within {timeout_s:.0f} s") from error
    if done.returncode != 0:
        # etcdctl logs JSON lines on stderr; the last line is the error it ended on.
        said = (done.stderr.strip().splitlines() or ["(nothing)"])[-1]
        raise EtcdToolFailed(f"{what} failed: {said}")
    return done.stdout


def save_snapshot(access: EtcdAccess, path: Path) -> str:
    """Save one member's snapshot to `path`; the endpoints are tried in turn (etcd serves a snapshot
    from exactly one member). Returns the endpoint that served it."""
    errors = []
    for endpoint in access.endpoint_list():
        try:
            _run(
                [
                    str(etcdctl_binary()),
                    *access.flags([endpoint], timeout_s=_PROBE_TIMEOUT_S),
                    "endpoint",
                    "status",
                ],
                f"etcd member {endpoint}",
                _PROBE_TIMEOUT_S * 2,
            )
            flags = access.flags([endpoint], timeout_s=_SNAPSHOT_TIMEOUT_S)
            _run(
                [str(etcdctl_binary()), *flags, "snapshot", "save", str(path)],
                f"etcdctl snapshot save from {endpoint}",
                _SNAPSHOT_TIMEOUT_S + 30,
            )
            return endpoint
        except EtcdToolFailed as error:
            errors.append(str(error))
    raise EtcdToolFailed("; ".join(errors) or "no etcd endpoint given")


def snapshot_status(path: Path) -> SnapshotStatus:
    out = _run(
        [str(etcdutl_binary()), "snapshot", "status", str(path), "-w", "json"], "etcdutl snapshot status"
    )
    try:
        status = json.loads(out)
        return SnapshotStatus(
            revision=int(status["revision"]),
            total_keys=int(status["totalKey"]),
            hash=int(status["hash"]),
            size_bytes=int(status["totalSize"]),
        )
    except (ValueError, KeyError, TypeError) as error:
        raise EtcdToolFailed(f"etcdutl snapshot status printed no status: {out[:200]!r}") from error


def get_prefix(access: EtcdAccess, prefix: str, *, revision: int = 0) -> list[tuple[str, bytes]]:
    """Every key under `prefix` with its value, at `revision` (0: the latest)."""
    argv = [str(etcdctl_binary()), *access.flags(), "get", prefix, "--prefix", "-w", "json"]
    if revision:
        argv.append(f"--rev={revision}")
    out = json.loads(_run(argv, f"etcdctl get {prefix}"))
    return [
        (base64.b64decode(kv["key"]).decode(), base64.b64decode(kv.get("value", "")))
        for kv in out.get("kvs", [])
    ]


def count_prefix(access: EtcdAccess, prefix: str, *, revision: int = 0) -> int:
    """How many keys under `prefix` at `revision`, counted by etcd (no values cross the wire)."""
    argv = [str(etcdctl_binary()), *access.flags(), "get", prefix, "--prefix", "--count-only", "-w", "fields"]
    if revision:
        argv.append(f"--rev={revision}")
    out = _run(argv, f"etcdctl get {prefix} --count-only")
    # `--count-only` prints only as fields (etcdctl refuses it with JSON): `"Count" : 12`.
    found = re.search(r'^"Count" : (\d+)$', out, re.MULTILINE)
    if found is None:
        raise EtcdToolFailed(f"etcdctl printed no count: {out[:200]!r}")
    return int(found.group(1))


def get_one(access: EtcdAccess, key: str) -> bytes | None:
    argv = [str(etcdctl_binary()), *access.flags(), "get", key, "-w", "json"]
    kvs = json.loads(_run(argv, f"etcdctl get {key}")).get("kvs", [])
    return base64.b64decode(kvs[0].get("value", "")) if kvs else None


def put(access: EtcdAccess, key: str, value: str) -> None:
    _run([str(etcdctl_binary()), *access.flags(), "put", key, value], f"etcdctl put {key}")


@dataclass(frozen=True, slots=True)
class MemberSpec:
    """The member a restored data dir belongs to: what etcd will be started with (`--name`,
    `--initial-cluster`, `--initial-advertise-peer-urls`, `--initial-cluster-token`). A restore
    makes a new cluster: every member of it is restored from the same snapshot with its own name."""

    name: str = "gpufed"
    initial_cluster: str = "gpufed=http://127.0.0.1:2380"
    peer_urls: str = "http://127.0.0.1:2380"
    cluster_token: str = "gpufed-restored"


def restore_snapshot(snapshot: Path, data_dir: Path, member: MemberSpec) -> None:
    """`etcdutl snapshot restore` into `data_dir`, which must not exist yet (etcdutl refuses one that
    does). etcdutl checks the hash etcdctl appended to the snapshot and refuses a damaged one."""
    _run(
        [
            str(etcdutl_binary()),
            "snapshot",
            "restore",
            str(snapshot),
            f"--data-dir={data_dir}",
            f"--name={member.name}",
            f"--initial-cluster={member.initial_cluster}",
            f"--initial-advertise-peer-urls={member.peer_urls}",
            f"--initial-cluster-token={member.cluster_token}",
        ],
        "etcdutl snapshot restore",
        _SNAPSHOT_TIMEOUT_S,
    )
