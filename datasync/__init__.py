"""gpufed datasync: datasets, content manifests, verified incremental sync between object stores, caches.

The public API federation builds on (see docs/datasync.md). Ray is not imported here:
`datasync.ray_executor.RayExecutor` imports it when it runs.
"""

from datasync.cache import (
    CachedCopy,
    CacheState,
    CopyKey,
    EvictionDecision,
    pin,
    plan_eviction,
    record_copy,
    unpin,
)
from datasync.codec import (
    dataset_from_json,
    dataset_to_json,
    manifest_from_json,
    manifest_to_json,
    version_from_json,
    version_to_json,
)
from datasync.errors import DatasyncError, SyncFailed
from datasync.journal import LocalJournal
from datasync.manifest import build_manifest, load_manifest, manifest_path, save_manifest
from datasync.model import (
    Dataset,
    DatasetName,
    DatasetVersion,
    Manifest,
    ManifestEntry,
    StoreLocation,
    StoreName,
    VersionId,
)
from datasync.plan import EgressEstimate, ExistingCopy, ReuseItem, SyncPlan, plan_sync
from datasync.progress import SyncProgress
from datasync.store import ObjectMeta, ObjectStore
from datasync.store_config import StoreConfig, open_store, parse_store_config
from datasync.sync import LocalExecutor, SyncReport, run_sync, sync_version
from datasync.transfer import SyncOptions
from datasync.verify import CheckReport, VerifyReport, check_copy, repair_copy, verify, verify_copy

__all__ = [
    "CacheState",
    "CachedCopy",
    "CheckReport",
    "CopyKey",
    "Dataset",
    "DatasetName",
    "DatasetVersion",
    "DatasyncError",
    "EgressEstimate",
    "EvictionDecision",
    "ExistingCopy",
    "LocalExecutor",
    "LocalJournal",
    "Manifest",
    "ManifestEntry",
    "ObjectMeta",
    "ObjectStore",
    "ReuseItem",
    "StoreConfig",
    "StoreLocation",
    "StoreName",
    "SyncFailed",
    "SyncOptions",
    "SyncPlan",
    "SyncProgress",
    "SyncReport",
    "VerifyReport",
    "VersionId",
    "build_manifest",
    "check_copy",
    "dataset_from_json",
    "dataset_to_json",
    "load_manifest",
    "manifest_from_json",
    "manifest_path",
    "manifest_to_json",
    "open_store",
    "parse_store_config",
    "pin",
    "plan_eviction",
    "plan_sync",
    "record_copy",
    "repair_copy",
    "run_sync",
    "save_manifest",
    "sync_version",
    "unpin",
    "verify",
    "verify_copy",
    "version_from_json",
    "version_to_json",
]
