"""Store configuration and credentials: where keys come from, and that no repr or log line shows one.

GCS and Azure cannot be reached from here (no server, loopback only), so their stores are only built
and configured, never called."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import structlog

from datasync.credentials import Secret, resolve_aws_credentials, resolve_aws_region
from datasync.errors import StoreConfigError
from datasync.store import ObjectStore
from datasync.store_config import (
    AzureStoreConfig,
    GcsStoreConfig,
    LocalStoreConfig,
    S3StoreConfig,
    open_store,
    parse_store_config,
)
from datasync.store_local import LocalStore
from datasync.store_memory import MemoryStore
from datasync.store_obstore import ObstoreStore

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"


def aws_files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "credentials").write_text(
        f"[default]\naws_access_key_id = AKDEFAULT\naws_secret_access_key = {SECRET}-default\n"
        f"[team]\naws_access_key_id = AKTEAM\naws_secret_access_key = {SECRET}\naws_session_token = tok\n"
    )
    (tmp_path / "config").write_text("[default]\nregion = eu-west-1\n[profile team]\nregion = us-west-2\n")
    return {
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
        "AWS_CONFIG_FILE": str(tmp_path / "config"),
    }


CREDENTIAL_CASES = [
    # (id, extra env, kwargs, expected key id, expected source)
    (
        "named-env-vars-first",
        {"MY_KEY": "AKMINE", "MY_SECRET": SECRET, "AWS_ACCESS_KEY_ID": "AKENV", "AWS_SECRET_ACCESS_KEY": "x"},
        {"access_key_id_env": "MY_KEY", "secret_access_key_env": "MY_SECRET"},
        "AKMINE",
        "env:MY_KEY",
    ),
    (
        "standard-env-vars",
        {"AWS_ACCESS_KEY_ID": "AKENV", "AWS_SECRET_ACCESS_KEY": SECRET},
        {},
        "AKENV",
        "env:AWS_ACCESS_KEY_ID",
    ),
    (
        "explicit-profile-beats-env",
        {"AWS_ACCESS_KEY_ID": "AKENV", "AWS_SECRET_ACCESS_KEY": SECRET},
        {"profile": "team"},
        "AKTEAM",
        "profile:team",
    ),
    ("aws-profile-variable", {"AWS_PROFILE": "team"}, {}, "AKTEAM", "profile:team"),
    ("default-profile", {}, {}, "AKDEFAULT", "profile:default"),
]


@pytest.mark.parametrize(
    ("env", "kwargs", "key_id", "source"),
    [c[1:] for c in CREDENTIAL_CASES],
    ids=[c[0] for c in CREDENTIAL_CASES],
)
def test_aws_credentials_come_from_the_usual_places_in_order(
    tmp_path: Path, env: dict[str, str], kwargs: dict[str, str], key_id: str, source: str
) -> None:
    creds = resolve_aws_credentials(env={**aws_files(tmp_path), **env}, **kwargs)
    assert creds is not None
    assert creds.access_key_id == key_id
    assert creds.source == source


def test_no_credentials_anywhere_means_none_and_region_comes_from_the_config_file(tmp_path: Path) -> None:
    assert resolve_aws_credentials(env={"HOME": str(tmp_path)}) is None
    assert resolve_aws_region(env=aws_files(tmp_path)) == "eu-west-1"
    assert resolve_aws_region(profile="team", env=aws_files(tmp_path)) == "us-west-2"
    assert resolve_aws_region(env={"AWS_REGION": "ap-south-1"}) == "ap-south-1"


def test_secrets_never_show_in_repr_str_or_format() -> None:
    secret = Secret(SECRET)
    creds = resolve_aws_credentials(env={"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": SECRET})
    for shown in (repr(secret), str(secret), f"{secret}", f"{secret!r}", repr(creds), str(creds)):
        assert SECRET not in shown
    assert secret.reveal() == SECRET


async def test_an_s3_store_shows_no_secret_in_repr_str_or_logs(tmp_path: Path) -> None:
    env = {"K": "AKID", "S": SECRET}
    config = S3StoreConfig(
        "data", endpoint="http://127.0.0.1:1", access_key_id_env="K", secret_access_key_env="S"
    )
    with structlog.testing.capture_logs() as logs:
        store = open_store("onprem", config, env=env)
        assert isinstance(store, ObstoreStore)
        assert store.supports_resumable_multipart
        # Nothing listens on port 1: the failure is logged by the caller and must not carry the secret.
        with pytest.raises(Exception) as failed:
            await store.put("x", b"1")
        structlog.get_logger().error("put_failed", error=str(failed.value), store=repr(store))
        await store.close()
    shown = repr(store) + str(store) + repr(config) + str(logs) + str(failed.value) + repr(failed.value)
    assert SECRET not in shown
    assert "onprem" in repr(store)


def test_named_credential_variables_that_are_missing_are_a_config_error() -> None:
    config = S3StoreConfig(
        "data", endpoint="http://127.0.0.1:1", access_key_id_env="NOPE", secret_access_key_env="NOPE2"
    )
    with pytest.raises(StoreConfigError, match="NOPE"):
        open_store("s", config, env={})


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (
            {"kind": "s3", "bucket": "b", "endpoint": "http://127.0.0.1:9000", "profile": "p"},
            S3StoreConfig("b", "http://127.0.0.1:9000", profile="p"),
        ),
        ({"kind": "gcs", "bucket": "b"}, GcsStoreConfig("b")),
        ({"kind": "azure", "container": "c", "account": "acct"}, AzureStoreConfig("c", "acct")),
        ({"kind": "local", "root": "/data"}, LocalStoreConfig("/data")),
    ],
    ids=["s3", "gcs", "azure", "local"],
)
def test_store_configs_parse_from_mappings(doc: dict[str, str], expected: object) -> None:
    assert parse_store_config(doc) == expected


@pytest.mark.parametrize(
    "doc",
    [{"kind": "ftp"}, {"kind": "s3", "bucket": "b", "secret_access_key": SECRET}, {"kind": "gcs"}],
    ids=["unknown-kind", "no-secrets-in-config", "missing-bucket"],
)
def test_bad_store_configs_are_rejected_without_echoing_values(doc: dict[str, str]) -> None:
    with pytest.raises(StoreConfigError) as failed:
        parse_store_config(doc)
    assert SECRET not in str(failed.value)


def test_gcs_and_azure_stores_are_built_with_their_credentials_but_not_called(tmp_path: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make a service-account key that obstore accepts")
    pem = subprocess.run(
        [openssl, "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    key_file = tmp_path / "sa.json"
    key_file.write_text(
        json.dumps(
            {
                "type": "service_account",
                "private_key": pem,
                "private_key_id": "1",
                "client_email": "sync@project.iam.gserviceaccount.com",
            }
        )
    )
    gcs = open_store("gcp", GcsStoreConfig("bucket-1"), env={"GOOGLE_APPLICATION_CREDENTIALS": str(key_file)})
    azure = open_store(
        "az", AzureStoreConfig("container-1", "acct", account_key_env="AZ_KEY"), env={"AZ_KEY": "a2V5"}
    )
    for store, endpoint in ((gcs, "gcs"), (azure, "azure:https://acct.blob.core.windows.net")):
        assert isinstance(store, ObstoreStore)
        assert isinstance(store, ObjectStore)
        assert store.endpoint_key == endpoint
        assert not store.supports_resumable_multipart
        assert "a2V5" not in repr(store)
    assert gcs.raw.config.get("bucket") == "bucket-1"  # type: ignore[attr-defined]
    assert "PRIVATE KEY" not in repr(gcs)
    with pytest.raises(StoreConfigError, match="gcp-bad"):
        open_store(
            "gcp-bad", GcsStoreConfig("b", service_account_path=str(tmp_path / "missing.json")), env={}
        )
    assert azure.raw.config.get("account_name") == "acct"  # type: ignore[attr-defined]


def test_local_and_memory_stores_satisfy_the_protocol(tmp_path: Path) -> None:
    assert isinstance(open_store("l", LocalStoreConfig(str(tmp_path))), LocalStore)
    assert isinstance(LocalStore("l", tmp_path), ObjectStore)
    assert isinstance(MemoryStore(), ObjectStore)
