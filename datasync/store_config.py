"""Store configurations: the keys federation's config file gives for each named store, and `open_store`.

A config holds no secret. It says where credentials come from (environment variable names, an AWS
profile, a GCS service-account file, an Azure account-key variable); `open_store` reads them when it
builds the client. Configuration keys, by `kind`:

- `s3`: bucket, endpoint (omit for AWS), region, profile, access_key_id_env, secret_access_key_env,
  session_token_env, virtual_hosted (bool, default False for a custom endpoint), ca_bundle (a PEM file
  of CA certificates to trust for an https endpoint, beside the system's: a private CA)
- `gcs`: bucket, service_account_path (else GOOGLE_APPLICATION_CREDENTIALS / the SDK's defaults)
- `azure`: container, account, account_key_env (else AZURE_STORAGE_ACCOUNT_KEY / the SDK's defaults),
  endpoint (for Azurite or sovereign clouds)
- `local`: root (a directory)
- `memory`: (tests) endpoint
"""

from __future__ import annotations

import datetime as dt
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from obstore.store import AzureStore, GCSStore, S3Store

from datasync.credentials import resolve_aws_credentials, resolve_aws_region
from datasync.errors import StoreConfigError
from datasync.s3_requests import S3Requests
from datasync.store import ObjectStore
from datasync.store_local import LocalStore
from datasync.store_memory import MemoryStore
from datasync.store_obstore import ObstoreStore

if TYPE_CHECKING:
    from obstore.store import RetryConfig

# obstore retries inside one call too; keep that short so our own backoff (which counts) decides.
_RETRY: RetryConfig = {
    "max_retries": 2,
    "backoff": {"init_backoff": dt.timedelta(milliseconds=100)},
    "retry_timeout": dt.timedelta(seconds=30),
}


@dataclass(frozen=True, slots=True)
class S3StoreConfig:
    bucket: str
    endpoint: str | None = None
    region: str | None = None
    profile: str | None = None
    access_key_id_env: str | None = None
    secret_access_key_env: str | None = None
    session_token_env: str | None = None
    virtual_hosted: bool | None = None
    # A PEM file of CA certificates to trust for an https endpoint (on-prem MinIO, Ceph or SeaweedFS
    # behind a private CA), in addition to the system's CAs. None: the system's CAs only. Certificates
    # are always verified; there is no key to turn that off.
    ca_bundle: str | None = None


@dataclass(frozen=True, slots=True)
class GcsStoreConfig:
    bucket: str
    service_account_path: str | None = None


@dataclass(frozen=True, slots=True)
class AzureStoreConfig:
    container: str
    account: str
    account_key_env: str | None = None
    endpoint: str | None = None


@dataclass(frozen=True, slots=True)
class LocalStoreConfig:
    root: str


@dataclass(frozen=True, slots=True)
class MemoryStoreConfig:
    endpoint: str = "memory"


StoreConfig = S3StoreConfig | GcsStoreConfig | AzureStoreConfig | LocalStoreConfig | MemoryStoreConfig

_KINDS: dict[str, type[Any]] = {
    "s3": S3StoreConfig,
    "gcs": GcsStoreConfig,
    "azure": AzureStoreConfig,
    "local": LocalStoreConfig,
    "memory": MemoryStoreConfig,
}


def parse_store_config(doc: Mapping[str, Any]) -> StoreConfig:
    """A config from a mapping such as `{"kind": "s3", "bucket": "data", "endpoint": "http://..."}`."""
    kind = doc.get("kind")
    if kind not in _KINDS:
        raise StoreConfigError(f"store kind must be one of {sorted(_KINDS)}, not {kind!r}")
    cls = _KINDS[kind]
    fields = set(cls.__dataclass_fields__)
    unknown = set(doc) - fields - {"kind"}
    if unknown:
        raise StoreConfigError(f"unknown keys for a {kind} store: {sorted(unknown)}")
    try:
        config: StoreConfig = cls(**{k: v for k, v in doc.items() if k != "kind"})
    except TypeError as e:
        raise StoreConfigError(f"{kind} store: {e}") from None
    return config


def open_store(name: str, config: StoreConfig, *, env: Mapping[str, str] | None = None) -> ObjectStore:
    """Build the store client; credentials are read here, from the sources the config names."""
    env = os.environ if env is None else env
    try:
        return _open(name, config, env)
    except StoreConfigError:
        raise
    except Exception as e:  # obstore's config errors; their text names fields and files, not secrets
        raise StoreConfigError(f"store {name}: {type(e).__name__}: {str(e).splitlines()[0]}") from None


def _open(name: str, config: StoreConfig, env: Mapping[str, str]) -> ObjectStore:
    if isinstance(config, S3StoreConfig):
        return _open_s3(name, config, env)
    if isinstance(config, GcsStoreConfig):
        gcs_kwargs: dict[str, Any] = {}
        path = config.service_account_path or env.get("GOOGLE_APPLICATION_CREDENTIALS")
        if path:
            gcs_kwargs["service_account_path"] = path
        gcs = GCSStore(config.bucket, retry_config=_RETRY, **gcs_kwargs)
        return ObstoreStore(name, gcs, endpoint_key="gcs", bucket=config.bucket)
    if isinstance(config, AzureStoreConfig):
        az_kwargs: dict[str, Any] = {"account_name": config.account}
        key = env.get(config.account_key_env or "AZURE_STORAGE_ACCOUNT_KEY")
        if key:
            az_kwargs["account_key"] = key
        if config.endpoint:
            az_kwargs["endpoint"] = config.endpoint
        azure = AzureStore(config.container, retry_config=_RETRY, **az_kwargs)
        endpoint = config.endpoint or f"https://{config.account}.blob.core.windows.net"
        return ObstoreStore(name, azure, endpoint_key=f"azure:{endpoint}", bucket=config.container)
    if isinstance(config, LocalStoreConfig):
        return LocalStore(name, Path(config.root))
    return MemoryStore(name, endpoint=config.endpoint)


def _open_s3(name: str, config: S3StoreConfig, env: Mapping[str, str]) -> ObstoreStore:
    creds = resolve_aws_credentials(
        profile=config.profile,
        access_key_id_env=config.access_key_id_env,
        secret_access_key_env=config.secret_access_key_env,
        session_token_env=config.session_token_env,
        env=env,
    )
    if (config.access_key_id_env or config.secret_access_key_env) and creds is None:
        raise StoreConfigError(
            f"store {name}: {config.access_key_id_env} / {config.secret_access_key_env} are not both set"
        )
    region = config.region or resolve_aws_region(profile=config.profile, env=env) or "us-east-1"
    tls, root_pem = _tls_of(name, config)
    # Unsigned payloads (as S3Requests sends, and the AWS SDKs over TLS): obstore would otherwise hash
    # every PUT body with sha256 just to sign it; content is verified against the manifest and ETags.
    kwargs: dict[str, Any] = {"region": region, "retry_config": _RETRY, "unsigned_payload": True}
    if config.endpoint:
        kwargs["endpoint"] = config.endpoint
        kwargs["virtual_hosted_style_request"] = bool(config.virtual_hosted)
        kwargs["client_options"] = {
            "allow_http": config.endpoint.startswith("http://"),
            "pool_max_idle_per_host": "64",
        }
        if root_pem is not None:
            kwargs["client_options"]["root_certificate"] = root_pem
    if creds is not None:
        kwargs["access_key_id"] = creds.access_key_id
        kwargs["secret_access_key"] = creds.secret_access_key.reveal()
        if creds.session_token is not None:
            kwargs["token"] = creds.session_token.reveal()
    try:
        raw = S3Store(config.bucket, **kwargs)
    except Exception as e:  # obstore raises its own config errors; no secret is in their text
        raise StoreConfigError(f"store {name}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    endpoint = config.endpoint or f"https://s3.{region}.amazonaws.com"
    signed = None
    if creds is not None:
        signed_endpoint = config.endpoint or endpoint
        signed = S3Requests(signed_endpoint, config.bucket, region, creds, tls=tls)
    return ObstoreStore(name, raw, endpoint_key=f"s3:{endpoint}", bucket=config.bucket, s3=signed)


def _tls_of(name: str, config: S3StoreConfig) -> tuple[ssl.SSLContext | None, str | None]:
    """The TLS context of the signed client and the PEM text for obstore, from `ca_bundle`. Both trust
    the bundle beside the system's CAs (obstore adds a root, it cannot replace them), and both verify
    the certificate and the host name."""
    if config.ca_bundle is None:
        return None, None
    if not (config.endpoint or "").startswith("https://"):
        raise StoreConfigError(
            f"store {name}: ca_bundle is set but the endpoint {config.endpoint!r} is not https://"
        )
    try:
        pem = Path(config.ca_bundle).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise StoreConfigError(f"store {name}: ca_bundle {config.ca_bundle}: {e}") from None
    context = ssl.create_default_context()
    try:
        context.load_verify_locations(cadata=pem)
    except (ssl.SSLError, ValueError) as e:
        raise StoreConfigError(
            f"store {name}: ca_bundle {config.ca_bundle} holds no PEM certificate ({e})"
        ) from None
    return context, pem
