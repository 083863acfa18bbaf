"""The seal of tenants' secrets: what opens, and what is refused with a clear error that names the
secret and never a value (federation.secrets.crypto, federation.secrets.keyfile)."""

from __future__ import annotations

import base64
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from federation.secrets.crypto import Keyring, SecretUnreadable
from federation.secrets.keyfile import KeyFileError, create_key_file, key_file_is_private, load_key_file

VALUE = b"hf_value-that-must-never-show"
KEY_A, KEY_B = os.urandom(32), os.urandom(32)


def _never_the_value(error: BaseException) -> str:
    text = str(error)
    assert VALUE.decode() not in text
    assert base64.b64encode(VALUE).decode() not in text
    return text


def test_a_sealed_secret_opens_under_its_tenant_and_name() -> None:
    ring = Keyring([KEY_A])
    sealed = ring.seal("vision", "hf", {"token": VALUE, "empty": b""})
    assert VALUE not in sealed.ciphertext
    assert ring.open("vision", "hf", sealed) == {"token": VALUE, "empty": b""}
    # A nonce per seal: the same values seal to different bytes.
    assert (
        ring.seal("vision", "hf", {"token": VALUE}).ciphertext
        != ring.seal("vision", "hf", {"token": VALUE}).ciphertext
    )


@pytest.mark.parametrize(
    ("tenant", "name", "why"),
    [
        pytest.param("nlp", "hf", "integrity check", id="moved-to-another-tenant"),
        pytest.param("vision", "hf2", "integrity check", id="moved-to-another-name"),
    ],
)
def test_a_ciphertext_moved_to_another_secret_is_refused(tenant: str, name: str, why: str) -> None:
    ring = Keyring([KEY_A])
    sealed = ring.seal("vision", "hf", {"token": VALUE})
    with pytest.raises(SecretUnreadable) as refused:
        ring.open(tenant, name, sealed)
    text = _never_the_value(refused.value)
    assert f"secret {name!r} of tenant {tenant!r}" in text
    assert why in text


def test_a_tampered_ciphertext_is_refused() -> None:
    ring = Keyring([KEY_A])
    sealed = ring.seal("vision", "hf", {"token": VALUE})
    flipped = bytes([sealed.ciphertext[0] ^ 1]) + sealed.ciphertext[1:]
    for broken in (replace(sealed, ciphertext=flipped), replace(sealed, nonce=os.urandom(12))):
        with pytest.raises(SecretUnreadable) as refused:
            ring.open("vision", "hf", broken)
        assert "failed its integrity check" in _never_the_value(refused.value)


def test_a_wrong_key_is_refused_naming_the_key_it_needs() -> None:
    sealed = Keyring([KEY_A]).seal("vision", "hf", {"token": VALUE})
    other = Keyring([KEY_B])
    with pytest.raises(SecretUnreadable) as refused:
        other.open("vision", "hf", sealed)
    text = _never_the_value(refused.value)
    assert sealed.key_id in text
    assert "key file does not hold" in text
    # A key of the same id but other bytes (an edited record) fails the integrity check instead.
    with pytest.raises(SecretUnreadable) as forged:
        other.open("vision", "hf", replace(sealed, key_id=other.primary_id))
    assert "integrity check" in _never_the_value(forged.value)


def test_rotation_the_first_key_seals_and_every_key_opens() -> None:
    old = Keyring([KEY_A]).seal("vision", "hf", {"token": VALUE})
    rotated = Keyring([KEY_B, KEY_A])
    assert rotated.open("vision", "hf", old) == {"token": VALUE}
    assert rotated.seal("vision", "hf", {"token": VALUE}).key_id == Keyring([KEY_B]).primary_id
    assert "Keyring(" in repr(rotated)
    assert KEY_A.hex() not in repr(rotated)


def test_the_key_file_is_made_private_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "state" / "secrets.key"
    create_key_file(path)
    assert path.stat().st_mode & 0o777 == 0o600
    first = load_key_file(path).primary_id
    create_key_file(path)  # a second `gpufed up` keeps the key
    assert load_key_file(path).primary_id == first


@pytest.mark.parametrize(
    ("content", "mode", "words"),
    [
        pytest.param("# nothing\n", 0o600, "holds no key", id="empty"),
        pytest.param("not base64!\n", 0o600, "line 1: not base64", id="not-base64"),
        pytest.param(
            base64.b64encode(b"short").decode() + "\n", 0o600, "a key is 32 bytes, got 5", id="short"
        ),
        pytest.param(base64.b64encode(KEY_A).decode() + "\n", 0o644, "chmod 600", id="readable-by-others"),
    ],
)
def test_a_bad_key_file_is_refused_naming_the_file(
    tmp_path: Path, content: str, mode: int, words: str
) -> None:
    path = tmp_path / "secrets.key"
    path.write_text(content)
    path.chmod(mode)
    with pytest.raises(KeyFileError) as refused:
        load_key_file(path)
    assert str(path) in str(refused.value)
    assert words in str(refused.value)
    assert base64.b64encode(KEY_A).decode() not in str(refused.value)


def test_a_missing_key_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match=r"secrets key file .*missing"):
        load_key_file(tmp_path / "missing")


@pytest.mark.parametrize(
    ("mode", "owner", "private"),
    [
        (0o600, 10001, True),
        (0o400, 10001, True),
        (0o640, 10001, False),  # a group may read a user's key: refused
        (0o440, 0, True),  # how Kubernetes mounts a Secret for a non-root pod (root, fsGroup, 0440)
        (0o640, 0, True),  # PostgreSQL's rule for a root-owned key file
        (0o660, 0, False),  # the group may write it
        (0o644, 0, False),  # anyone may read it
    ],
)
def test_a_key_file_is_private_to_its_owner_or_root_owned_and_group_read(
    mode: int, owner: int, private: bool
) -> None:
    assert key_file_is_private(stat.S_IFREG | mode, owner) is private
