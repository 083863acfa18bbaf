"""SubmitJob's check of `spec.dataset`: a job naming data its tenant cannot use is refused when it is
submitted, rather than admitted, placed and then failed by STAGING minutes later.

The submit path is benchmarked (hundreds of submissions a second), so the check reads a view of the
registry's datasets kept in memory and re-read at most every few seconds, as `TenantDirectory` does for
tenants. A reference the view cannot vouch for costs one etcd lookup of that dataset before it is
refused: the view may trail a registration or a share made a moment ago on this or another server, and a
job must not be refused for that. Accepted references never read etcd between refreshes.

The rule is the one STAGING and the placer apply: a name the registry knows is decided by the registry
(the dataset must be the tenant's own or shared with it, and have the version); only a name it does not
know may be vouched for by the config's `datasets:` list. A bare name is the submitting tenant's
dataset, `tenant/name` another tenant's (`federation.datasets.registry`); the config's entries are
the admins', global and matched by the reference exactly as written.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from datasync import Dataset, VersionId
from federation.datasets.grants import GrantDirectory, allows
from federation.datasets.registry import DatasetRegistry, qualified, resolve
from federation.datasets.stores import StoreDirectory
from federation.errors import FailedPrecondition, PermissionDenied
from federation.spec.jobspec import DatasetRef, TrainingJobSpec
from federation.store.jobs import JobRecord
from federation.store.records import SchedulingSettings
from placement.model import TenantId

# (tenant, `tenant/name`, version) -> the live job that will make that version, if any
# (`federation.datasets.outputs.OutputsController.declared`).
Declared = Callable[[str, str, str], JobRecord | None]

log = structlog.get_logger("gpufed.datasets")

FIELD = "spec.dataset"
# Datasets change about as rarely as tenants: the same refresh interval.
DATASET_REFRESH_S = 2.0


def refusal(
    ref: DatasetRef, tenant: TenantId, dataset: Dataset | None, settings: SchedulingSettings
) -> str | None:
    """Why `tenant` may not submit a job reading `ref` (None: it may)."""
    if dataset is None:
        if settings.dataset(str(ref)) is not None:
            return None
    elif dataset.visible_to(tenant):
        if resolve(dataset, ref.version) is not None:
            return None
        known = ", ".join(v.version for v in dataset.versions)
        return f"{FIELD}: dataset {ref.name!r} has no version {ref.version!r} (registered: {known})"
    # Another tenant's unshared dataset reads exactly like a missing one: its name says nothing.
    return f"{FIELD}: {not_registered(ref, tenant)} nor listed in the config's datasets:"


def not_registered(ref: DatasetRef, tenant: TenantId) -> str:
    return f"dataset {str(ref)!r} is not registered for tenant {tenant} (own or shared with it)"


def _lookup(view: dict[str, Dataset], tenant: TenantId, ref: str) -> Dataset | None:
    """`DatasetRegistry.lookup` over the view: the qualified name, else a legacy bare one of its owner."""
    name = qualified(tenant, ref)
    owner, _, bare = name.partition("/")
    legacy = view.get(bare)
    return view.get(name) or (legacy if legacy is not None and legacy.tenant == owner else None)


class DatasetCheck:
    """The registry's datasets in memory for the submit path, re-read at most every `refresh_s`."""

    def __init__(
        self,
        registry: DatasetRegistry,
        *,
        refresh_s: float = DATASET_REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._refresh_s = refresh_s
        self._clock = clock
        self._datasets: dict[str, Dataset] = {}
        self._read_at = float("-inf")
        # Set by the outputs controller's wiring: a version a live job will make may be named as input.
        self.declared: Declared | None = None
        # One listing at a time: a burst of submissions at the refresh moment must not each list.
        self._lock = asyncio.Lock()

    async def _view(self) -> dict[str, Dataset]:
        if self._clock() - self._read_at > self._refresh_s:
            async with self._lock:
                if self._clock() - self._read_at > self._refresh_s:
                    self._datasets = {d.name: d for d in await self._registry.list()}
                    self._read_at = self._clock()
        return self._datasets

    async def check(self, tenant: TenantId, ref: DatasetRef, settings: SchedulingSettings) -> None:
        """Raise FailedPrecondition naming the field and the reference unless the tenant may use it."""
        view = await self._view()
        if refusal(ref, tenant, _lookup(view, tenant, ref.name), settings) is None:
            return
        # The view may trail a registration or share made since it was read: ask etcd before refusing.
        stored = await self._registry.lookup(tenant, ref.name)
        dataset = None if stored is None else stored.value
        if dataset is not None:
            self._datasets[dataset.name] = dataset
        reason = refusal(ref, tenant, dataset, settings)
        if reason is not None and self.pending_output(tenant, ref, dataset) is not None:
            return  # waits in STAGING until the job that makes it succeeds (federation.datasets.staging)
        if reason is not None:
            log.info("dataset_reference_refused", tenant=tenant, dataset=str(ref))
            raise FailedPrecondition(reason)

    def pending_output(self, tenant: TenantId, ref: DatasetRef, dataset: Dataset | None) -> JobRecord | None:
        """The live job that will make the version `ref` names, if the tenant may read it once made:
        its own tenant's, or a version of a dataset its owner shared with it."""
        if ref.version is None or self.declared is None:
            return None
        name = qualified(tenant, ref.name)
        owner = name.partition("/")[0]
        if owner != tenant and (dataset is None or not dataset.visible_to(tenant)):
            return None
        return self.declared(owner, name, ref.version)

    def awaiting(self, job: JobRecord) -> str:
        """Why a queued job is held out of the placer's queue ("" when it is not): its input version is
        one a live job will make (`federation.datasets.outputs.awaited_inputs`), for `explain`."""
        ref = job.spec.dataset
        if ref is None or ref.version is None or self.declared is None:
            return ""
        name = qualified(job.tenant, ref.name)
        maker = self.declared(name.partition("/")[0], name, ref.version)
        if maker is None:
            return ""
        # Another tenant's job is not named to this one (it may read the data, not the owner's jobs).
        who = (
            f"job {maker.job_id} ({maker.phase.value.lower()})"
            if maker.tenant == job.tenant
            else "its owner's job"
        )
        return (
            f"waiting for its input {name}@{ref.version}, the declared output of {who}; "
            "it is queued for GPUs once that job succeeds and the version is registered"
        )

    async def check_outputs(self, tenant: TenantId, spec: TrainingJobSpec) -> None:
        """A job's outputs: a version that exists already is refused (versions are immutable), and a
        path must be granted to the tenant in some store (the server reads it with its own rights)."""
        stores = await StoreDirectory(self._registry.kv).list()
        grants = GrantDirectory(self._registry.kv)
        for i, output in enumerate(spec.outputs):
            at = f"spec.outputs[{i}]"
            if output.version is not None:
                stored = await self._registry.lookup(tenant, output.dataset)
                if stored is not None and stored.value.version(VersionId(output.version)) is not None:
                    raise FailedPrecondition(
                        f"{at}.version: {stored.value.name}@{output.version} exists already; versions are "
                        "immutable, name a new one"
                    )
            granted: list[str] = []
            for record in stores:
                grant = await grants.effective(record.name, tenant, record.dataset_prefixes)
                if allows(grant.prefixes, output.path):
                    break
                granted.extend(f"{record.name}:{p}" for p in grant.prefixes)
            else:
                if stores:
                    raise PermissionDenied(
                        f"{at}.path: tenant {tenant} may write datasets only under its granted prefixes "
                        f"({', '.join(granted) or 'none'}), not {output.path!r}"
                    )
