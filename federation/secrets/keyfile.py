"""The secrets key file: where the key that seals tenants' secrets lives, outside etcd.

One key per line, base64 (32 bytes each); `#` starts a comment. The first key seals new and re-put
secrets; the others still open what they sealed, which is how the key is rotated (docs/security.md,
"Secrets"). The file must be readable by its owner only (mode 0600): a key readable by anyone on
the host would make the seal pointless. `gpufed up` makes one in its state dir; `gpufed serve`
reads `GPUFED_SECRETS_KEY_FILE`, else `secrets.key` in its state dir, and without one serves no
secrets. Servers that share an etcd must share the key file too.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from pathlib import Path

from federation.errors import FailedPrecondition
from federation.secrets.crypto import KEY_BYTES, Keyring

ENV_VAR = "GPUFED_SECRETS_KEY_FILE"
FILE_NAME = "secrets.key"


class KeyFileError(FailedPrecondition):
    """The key file is missing, unreadable, too open, or holds no valid key. Names the file and the
    line, never a key."""


def create_key_file(path: Path) -> None:
    """A new file with one fresh key, mode 0600, made atomically; an existing file is kept as it is."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as out:
        out.write("# gpufed secrets key: keep it out of backups of etcd; the first line seals.\n")
        out.write(base64.b64encode(os.urandom(KEY_BYTES)).decode() + "\n")


def key_file_is_private(mode: int, owner: int) -> bool:
    """Readable by its owner only; or owned by root and also readable by its group, as PostgreSQL
    allows its key file. That is how Kubernetes mounts a Secret for a non-root process: owned by root,
    the pod's fsGroup as group, mode 0440 (deploy/helm/gpufed, `secrets.keySecret`)."""
    if mode & stat.S_IRWXO:
        return False
    group = mode & stat.S_IRWXG
    return group == 0 or (owner == 0 and group == stat.S_IRGRP)


def load_key_file(path: Path) -> Keyring:
    try:
        info = path.stat()
        mode, owner = info.st_mode, info.st_uid
        text = path.read_text()
    except OSError as error:
        raise KeyFileError(f"secrets key file {path}: {error.strerror or error}") from None
    if not key_file_is_private(mode, owner):
        raise KeyFileError(
            f"secrets key file {path} is open to group or others (mode {stat.S_IMODE(mode):04o}): "
            f"run chmod 600 {path} (or, owned by root, 640)"
        )
    keys = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            key = base64.b64decode(line, validate=True)
        except (binascii.Error, ValueError):
            raise KeyFileError(f"secrets key file {path}, line {number}: not base64") from None
        if len(key) != KEY_BYTES:
            raise KeyFileError(
                f"secrets key file {path}, line {number}: a key is {KEY_BYTES} bytes, got {len(key)}"
            )
        keys.append(key)
    if not keys:
        raise KeyFileError(f"secrets key file {path} holds no key")
    return Keyring(keys)
