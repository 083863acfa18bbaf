"""`gpufed admin backup`: one directory from which `gpufed admin restore` rebuilds the federation.

What it holds, in the order it is taken:

1. `etcd.snapshot.db`: etcd's snapshot, one consistent copy of the whole keyspace at one revision
   (jobs, ledger intervals, tokens' hashes, users, tenants, approvals, datasets and their version
   manifests, settings) — `federation.runtime.etcd_backup`.
2. `datasets.json`: the registered datasets, their version manifests and the registration grants,
   read at the snapshot's revision: the same state as the snapshot, readable without etcd (to check
   an object store against, or to see what a backup holds).
3. `history.sqlite3` or `history.jsonl.gz`: the history database, dumped after the snapshot
   (`federation.runtime.history_dump`).
4. `manifest.json`: versions, times, revisions, row counts, the admins' token hashes, every file's
   SHA-256.

Why etcd first: a job the archiver moves to SQL between the two reads is then in both (restored
ended in etcd, and archived again: the archiver's insert is idempotent and it deletes the etcd copy).
The other order could miss a job archived in between: in neither copy.

Only an admin may take one. The caller's token is checked against the tokens and users in the etcd
being backed up, as the server checks it, before anything is read, and the backup is written to the
audit trail. The files are written into a hidden directory beside `--out` and renamed to it when
complete, so `--out` never holds half a backup.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from federation.runtime.backup_manifest import (
    AdminToken,
    BackupManifest,
    BackupRefused,
    file_entry,
    write_manifest,
)
from federation.runtime.etcd_backup import (
    EtcdAccess,
    count_prefix,
    get_one,
    get_prefix,
    put,
    save_snapshot,
    snapshot_status,
)
from federation.runtime.history_dump import dump_history, probe_history
from federation.security.tokens import token_from_dict, token_hash
from federation.store.records import Role, UserRecord, user_from_dict
from federation.store.schema_version import loads

SNAPSHOT_FILE = "etcd.snapshot.db"
DATASETS_FILE = "datasets.json"
PREFIX = "/gpufed/"
_TOKENS, _USERS, _AUDIT = "/gpufed/tokens/", "/gpufed/users/", "/gpufed/audit/"
_DATASETS, _MANIFESTS, _GRANTS = "/gpufed/datasets/", "/gpufed/manifests/", "/gpufed/dataset-grants/"


@dataclass(frozen=True, slots=True)
class BackupResult:
    directory: Path
    manifest: BackupManifest


def gpufed_version() -> str:
    try:
        return importlib.metadata.version("gpufed")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def authorize(access: EtcdAccess, token: str, *, now_s: float) -> UserRecord:
    """The token's user if it is an admin's, as the server would resolve it now; else BackupRefused."""
    raw = get_one(access, _TOKENS + token_hash(token))
    record = None if raw is None else loads(raw, _TOKENS + token_hash(token))
    expires = None if record is None else record.get("expires_at_s")
    if record is None or (expires is not None and float(expires) <= now_s):
        raise BackupRefused("unknown, revoked or expired token: a backup needs an admin's token")
    user_raw = get_one(access, _USERS + str(record["user"]))
    if user_raw is None:
        raise BackupRefused(f"the token's user {record['user']} no longer exists")
    user = user_from_dict(loads(user_raw, _USERS + str(record["user"])))
    if user.role is not Role.ADMIN:
        raise BackupRefused(
            f"only an admin may back up the federation (you are {user.name}, role {user.role})"
        )
    return user


def _empty_dir_or_absent(path: Path) -> bool:
    return not path.exists() or (path.is_dir() and not any(path.iterdir()))


def _decode(value: bytes) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return {"undecoded": value.decode(errors="replace")}


def _admin_tokens(access: EtcdAccess, revision: int) -> tuple[AdminToken, ...]:
    users = {
        k[len(_USERS) :]: user_from_dict(loads(v, _USERS + k[len(_USERS) :]))
        for k, v in get_prefix(access, _USERS, revision=revision)
    }
    out = []
    for key, value in get_prefix(access, _TOKENS, revision=revision):
        hash_hex = key[len(_TOKENS) :]
        record = token_from_dict(hash_hex, loads(value, key))
        user = users.get(record.user)
        if user is not None and user.role is Role.ADMIN:
            out.append(AdminToken(sha256=hash_hex, user=user.name, expires_at_s=record.expires_at_s))
    return tuple(out)


def _export_datasets(access: EtcdAccess, revision: int, path: Path) -> tuple[int, int]:
    datasets = get_prefix(access, _DATASETS, revision=revision)
    manifests = get_prefix(access, _MANIFESTS, revision=revision)
    grants = get_prefix(access, _GRANTS, revision=revision)
    doc = {
        "etcd_revision": revision,
        "datasets": {k: _decode(v) for k, v in datasets},
        "manifests": {k: _decode(v) for k, v in manifests},
        "grants": {k: _decode(v) for k, v in grants},
    }
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return len(datasets), len(manifests)


def _audit(access: EtcdAccess, user: UserRecord, out: Path, now_s: float) -> None:
    key = _AUDIT + f"{int(now_s * 1e9):020d}-{secrets.token_hex(4)}"
    value = {"at_s": now_s, "user": user.name, "role": user.role.value, "action": "backup"}
    put(access, key, json.dumps({**value, "target": str(out), "detail": ""}))


def take_backup(out: Path, access: EtcdAccess, history_dsn: str, token: str) -> BackupResult:
    now_s = time.time()
    user = authorize(access, token, now_s=now_s)
    out = out.resolve()
    if not _empty_dir_or_absent(out):
        raise BackupRefused(f"{out} is not empty: a backup goes into a new or empty directory")
    # Before anything is written (the audit record, the snapshot): the history must be there to dump.
    probe_history(history_dsn)
    staging = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o700, parents=True)
    try:
        _audit(access, user, out, now_s)
        endpoint = save_snapshot(access, staging / SNAPSHOT_FILE)
        status = snapshot_status(staging / SNAPSHOT_FILE)
        gpufed_keys = count_prefix(access, PREFIX, revision=status.revision)
        datasets, versions = _export_datasets(access, status.revision, staging / DATASETS_FILE)
        tokens = _admin_tokens(access, status.revision)
        history = dump_history(history_dsn, staging)
        files = {name: file_entry(staging / name) for name in (SNAPSHOT_FILE, DATASETS_FILE, history.file)}
        manifest = BackupManifest(
            gpufed_version=gpufed_version(),
            created_at=datetime.fromtimestamp(now_s, UTC).isoformat(timespec="seconds"),
            created_by=user.name,
            etcd_endpoint=endpoint,
            etcd_revision=status.revision,
            etcd_hash=status.hash,
            etcd_total_keys=status.total_keys,
            gpufed_keys=gpufed_keys,
            history_backend=history.backend,
            history_revision=history.revision,
            history_rows=history.rows_by_table,
            datasets=datasets,
            dataset_versions=versions,
            admin_tokens=tokens,
            files=files,
            notes=(
                "etcd was snapshotted before the history was dumped: a job archived in between is in both",
                "jobs accepted after the etcd snapshot are not in this backup",
            ),
        )
        write_manifest(staging, manifest)
        if out.exists():
            out.rmdir()
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return BackupResult(out, manifest)
