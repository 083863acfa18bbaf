"""`gpufed admin restore`: a backup into an empty deployment, all of it or nothing.

In order, and nothing is written until the checks pass:

1. The manifest is read and every file checked against its size and SHA-256; a damaged backup is
   refused naming the file.
2. The caller's token must be one of the backed-up federation's admins' (the manifest keeps their
   tokens' hashes, as etcd does): the restored federation will accept it as an admin's, so whoever
   could not act as admin there cannot put it in place either. No server runs yet to ask.
3. The targets must be empty: the etcd data dir absent or an empty directory, the history database
   without history rows. `force` replaces them: the old data dir is kept beside the new one
   (`<dir>.replaced-<time>`), and so is an old SQLite file; PostgreSQL's old history tables are dropped
   in the restore's own transaction.
4. etcd's snapshot becomes a data dir beside the target (`etcdutl snapshot restore`, which also checks
   etcd's own hash), the history is loaded (one transaction, or a file renamed into place; its row
   counts checked against the manifest before it commits), then the data dir is renamed into place.
   A failure on the way removes what was built, and the targets are as they were.

A three-member etcd is restored member by member: the same backup, each with its own `--etcd-name`
and the cluster's `--initial-cluster`; the history only once (omit `--history-dsn` for the others).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from federation.runtime.backup import SNAPSHOT_FILE
from federation.runtime.backup_manifest import (
    MANIFEST,
    BackupDamaged,
    BackupManifest,
    BackupRefused,
    read_manifest,
    verify_files,
)
from federation.runtime.etcd_backup import MemberSpec, restore_snapshot
from federation.runtime.history_dump import held_rows, load_history
from federation.security.tokens import token_hash


@dataclass(frozen=True, slots=True)
class RestoreResult:
    manifest: BackupManifest
    etcd_data_dir: Path | None
    history_rows: dict[str, int]
    # Where forced restores put what they replaced.
    kept_aside: tuple[Path, ...]


def authorize_restore(manifest: BackupManifest, token: str, *, now_s: float) -> str:
    """The admin the token was in the backed-up federation; BackupRefused otherwise."""
    hash_hex = token_hash(token)
    for admin in manifest.admin_tokens:
        if admin.sha256 == hash_hex and (admin.expires_at_s is None or admin.expires_at_s > now_s):
            return admin.user
    raise BackupRefused(
        "only an admin of the backed-up federation may restore it: this token is not one "
        "(unknown there, expired, or not an admin's)"
    )


def _stamp(now_s: float) -> str:
    return datetime.fromtimestamp(now_s, UTC).strftime("%Y%m%dT%H%M%SZ")


def _etcd_holds(data_dir: Path) -> bool:
    """Whether a running etcd has its database open: bbolt holds an exclusive flock on it."""
    db = data_dir / "member" / "snap" / "db"
    if not db.is_file():
        return False
    with db.open("rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


def check_targets(etcd_data_dir: Path | None, history_dsn: str | None, force: bool) -> dict[str, int]:
    if etcd_data_dir is not None and etcd_data_dir.exists():
        if not etcd_data_dir.is_dir():
            raise BackupRefused(f"{etcd_data_dir} is a file, not an etcd data dir")
        if any(etcd_data_dir.iterdir()) and not force:
            raise BackupRefused(
                f"{etcd_data_dir} is not empty: restore builds a new etcd data dir "
                "(stop etcd and give a new path, or --force to keep the old one aside and replace it)"
            )
        if _etcd_holds(etcd_data_dir):
            raise BackupRefused(f"an etcd is running on {etcd_data_dir}: stop it first, even with --force")
    held = held_rows(history_dsn) if history_dsn is not None else {}
    if held and not force:
        listed = ", ".join(f"{name} {rows}" for name, rows in sorted(held.items()))
        raise BackupRefused(
            f"the history database already holds rows ({listed}): restore needs an empty one "
            "(a new database, or --force to replace its history tables)"
        )
    return held


def restore_backup(
    source: Path,
    token: str,
    *,
    etcd_data_dir: Path | None,
    member: MemberSpec,
    history_dsn: str | None,
    force: bool = False,
) -> RestoreResult:
    if etcd_data_dir is None and history_dsn is None:
        raise BackupRefused("nothing to restore into: give an etcd data dir, a history database, or both")
    now_s = time.time()
    manifest = read_manifest(source)
    verify_files(source, manifest)
    authorize_restore(manifest, token, now_s=now_s)
    etcd_data_dir = etcd_data_dir.resolve() if etcd_data_dir is not None else None
    held = check_targets(etcd_data_dir, history_dsn, force)
    building = (
        etcd_data_dir.with_name(f".{etcd_data_dir.name}.restoring-{os.getpid()}")
        if etcd_data_dir is not None
        else None
    )
    aside: list[Path] = []
    counts: dict[str, int] = {}
    try:
        if building is not None:
            shutil.rmtree(building, ignore_errors=True)
            building.parent.mkdir(parents=True, exist_ok=True)
            restore_snapshot(source / SNAPSHOT_FILE, building, member)
            # etcd wants its data dir private.
            building.chmod(0o700)
        if history_dsn is not None:
            dump = next((name for name in manifest.files if name.startswith("history.")), None)
            if dump is None:
                raise BackupDamaged(f"{source / MANIFEST}: names no history file")
            counts, kept = load_history(
                source / dump, history_dsn, expected=manifest.history_rows, keep_aside=bool(held)
            )
            aside += [kept] if kept is not None else []
        if etcd_data_dir is not None and building is not None:
            if etcd_data_dir.exists() and any(etcd_data_dir.iterdir()):
                old = etcd_data_dir.with_name(f"{etcd_data_dir.name}.replaced-{_stamp(now_s)}")
                os.replace(etcd_data_dir, old)
                aside.append(old)
            elif etcd_data_dir.exists():
                etcd_data_dir.rmdir()
            os.replace(building, etcd_data_dir)
    except BaseException:
        if building is not None:
            shutil.rmtree(building, ignore_errors=True)
        raise
    return RestoreResult(manifest, etcd_data_dir, counts, tuple(aside))
