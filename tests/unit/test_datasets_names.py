"""Dataset names are per tenant (issue 16): two tenants may each have `imagenet`, a bare name is the
caller's own tenant's, `tenant/name` another tenant's; a dataset registered before names were per tenant
keeps its key and its copies, and a lookup reads the same keys whichever dataset exists."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from datasync import (
    CachedCopy,
    CopyKey,
    Dataset,
    DatasetName,
    DatasetVersion,
    Manifest,
    ManifestEntry,
    StoreLocation,
    StoreName,
    VersionId,
    build_manifest,
    dataset_to_json,
    manifest_to_json,
)
from datasync.store_config import LocalStoreConfig
from federation.datasets.check import DatasetCheck
from federation.datasets.registry import (
    DatasetRegistry,
    cache_prefix,
    dataset_ref_field,
    locations_reader,
    placer_locations,
    with_registry_locations,
)
from federation.datasets.staging import GateKind
from federation.datasets.stores import StoreRecord
from federation.errors import FailedPrecondition, InvalidSpec
from federation.scheduling.snapshot import PlacerInputs, gang_request
from federation.spec.jobspec import DatasetRef
from federation.spec.priorities import DEFAULT_PRIORITY_CLASSES
from federation.spec.training_job import parse_manifest
from federation.store.kv import KeyValue
from federation.store.kv_memory import MemoryKv
from federation.store.records import DatasetLocation, SchedulingSettings
from placement.model import TenantId
from tests.conftest import build_job
from tests.unit.test_datasets_staging import _world, staged_job

VISION, NLP, SPEECH = TenantId("vision"), TenantId("nlp"), TenantId("speech")


def manifest(content: bytes) -> Manifest:
    return Manifest((ManifestEntry("a.bin", len(content), content.hex().ljust(64, "0")[:64]),))


def version(name: str, v: str, content: bytes, store: str = "home") -> tuple[DatasetVersion, Manifest]:
    m = manifest(content)
    record = DatasetVersion(
        DatasetName(name), VersionId(v), StoreLocation(StoreName(store), f"{name}/"), m.digest, 3, 1, 1.0
    )
    return record, m


async def register(
    registry: DatasetRegistry,
    tenant: TenantId,
    name: str,
    v: str,
    content: bytes,
    shared: frozenset[TenantId],
) -> Dataset:
    record, m = version(name, v, content)
    dataset, _ = await registry.add_version(tenant, record, m, shared)
    return dataset


async def test_two_tenants_register_the_same_name_and_each_sees_only_its_own() -> None:
    registry = DatasetRegistry(MemoryKv())
    mine = await register(registry, VISION, "imagenet", "v1", b"vision", frozenset())
    theirs = await register(registry, NLP, "imagenet", "v1", b"nlp", frozenset())
    assert (mine.name, theirs.name) == ("vision/imagenet", "nlp/imagenet")
    assert mine.versions[0].manifest_digest != theirs.versions[0].manifest_digest
    for tenant, want in ((VISION, mine), (NLP, theirs)):
        found = await registry.lookup(tenant, "imagenet")
        assert found is not None
        assert found.value == want
    assert await registry.lookup(SPEECH, "imagenet") is None
    # Each tenant's manifest, copy record and cache prefix are its own.
    assert await registry.manifest("vision/imagenet", "v1") == manifest(b"vision")
    assert await registry.manifest("nlp/imagenet", "v1") == manifest(b"nlp")
    assert cache_prefix(mine.name, "v1") == "gpufed-cache/vision/imagenet/v1/"
    for d in (mine, theirs):
        key = CopyKey(StoreName("cloud"), d.name, VersionId("v1"))
        assert await registry.put_copy(
            CachedCopy(key, 3, 1.0, frozenset({f"job-{d.tenant}"})), expect_revision=None
        )
    copies = {c.key: c.pinned_by for c in (await registry.copies("cloud")).copies}
    assert copies == {
        CopyKey(StoreName("cloud"), DatasetName("vision/imagenet"), VersionId("v1")): frozenset(
            {"job-vision"}
        ),
        CopyKey(StoreName("cloud"), DatasetName("nlp/imagenet"), VersionId("v1")): frozenset({"job-nlp"}),
    }
    # The placer's references: each tenant's under its own name.
    refs = {loc.dataset for loc in placer_locations([mine, theirs], await registry.copies())}
    assert refs == {"vision/imagenet", "vision/imagenet@v1", "nlp/imagenet", "nlp/imagenet@v1"}


async def test_a_shared_dataset_is_named_owner_slash_name_and_the_submit_check_follows() -> None:
    registry = DatasetRegistry(MemoryKv())
    await register(registry, VISION, "imagenet", "v1", b"vision", frozenset({NLP}))
    check = DatasetCheck(registry)
    settings = SchedulingSettings()
    await check.check(NLP, DatasetRef("vision/imagenet", "v1"), settings)
    await check.check(VISION, DatasetRef("vision/imagenet"), settings)  # one's own, qualified: the same
    answers = []
    for tenant, ref in (
        (NLP, DatasetRef("imagenet", "v1")),  # bare: nlp's own, and nlp has none
        (SPEECH, DatasetRef("vision/imagenet", "v1")),  # not shared with speech
        (SPEECH, DatasetRef("vision/nothing", "v1")),  # does not exist
        (SPEECH, DatasetRef("nobody/imagenet", "v1")),  # no such tenant
    ):
        with pytest.raises(FailedPrecondition) as caught:
            await check.check(tenant, ref, settings)
        answers.append(str(caught.value).replace(ref.name, "<ref>").replace(tenant, "<tenant>"))
    assert len(set(answers)) == 1, answers


class CountingKv(MemoryKv):
    def __init__(self) -> None:
        super().__init__()
        self.keys: list[bytes] = []

    async def get(self, key: bytes) -> KeyValue | None:
        self.keys.append(key)
        return await super().get(key)

    async def range_prefix(self, *args: Any, **kwargs: Any) -> Any:
        self.keys.append(b"range")
        return await super().range_prefix(*args, **kwargs)


async def test_an_outsiders_lookup_reads_what_a_lookup_of_nothing_reads() -> None:
    kv = CountingKv()
    registry = DatasetRegistry(kv)
    await register(registry, VISION, "secret", "v1", b"s", frozenset())
    shapes = []
    for ref in ("vision/secret", "vision/nothing"):
        kv.keys.clear()
        await registry.lookup(SPEECH, ref)
        shapes.append([k.replace(b"secret", b"X").replace(b"nothing", b"X") for k in kv.keys])
    assert shapes[0] == shapes[1]
    assert len(shapes[0]) == 2  # the tenant's key and the key of a name from before per-tenant names


async def test_a_dataset_registered_before_names_were_per_tenant_keeps_working() -> None:
    kv = MemoryKv()
    registry = DatasetRegistry(kv)
    # As an older server wrote it: under /gpufed/datasets/<name>, named without its tenant.
    old, _ = version("imagenet", "v1", b"old")
    legacy = Dataset(DatasetName("imagenet"), VISION, StoreName("home"), (old,), frozenset({NLP}))
    await kv.put(b"/gpufed/datasets/imagenet", dataset_to_json(legacy))
    for tenant, ref in ((VISION, "imagenet"), (VISION, "vision/imagenet"), (NLP, "vision/imagenet")):
        found = await registry.lookup(tenant, ref)
        assert found is not None, (tenant, ref)
        assert found.value.name == "imagenet"  # its copies and cache prefix stay where they are
    assert await registry.lookup(NLP, "imagenet") is None  # nlp's bare name is nlp's own
    assert await registry.lookup(SPEECH, "speech/imagenet") is None
    # Its owner's next version joins it (no second dataset of the same name), another tenant's is new.
    await register(registry, VISION, "imagenet", "v2", b"new", frozenset())
    stored = await registry.lookup(VISION, "imagenet")
    assert stored is not None
    assert [v.version for v in stored.value.versions] == ["v1", "v2"]
    assert stored.value.versions[1].dataset == "imagenet"
    await register(registry, NLP, "imagenet", "v1", b"nlp", frozenset())
    assert sorted(d.name for d in await registry.list()) == ["imagenet", "nlp/imagenet"]
    loc = {x.dataset for x in placer_locations(await registry.list(), await registry.copies())}
    assert {"vision/imagenet", "vision/imagenet@v2", "nlp/imagenet"} <= loc


@pytest.mark.parametrize("value", ["imagenet", "vision/imagenet", "a/b.c-d"])
def test_references_are_a_name_or_tenant_slash_name(value: str) -> None:
    assert dataset_ref_field(value) == value


@pytest.mark.parametrize("value", ["", "a/b/c", "/imagenet", "vision/", "Vision/x", "a_b/x", "x/Y", 3])
def test_other_references_are_refused(value: object) -> None:
    with pytest.raises(InvalidSpec, match=r"^name: must be 'name'"):
        dataset_ref_field(value)


async def test_a_tenant_registers_only_in_its_own_namespace() -> None:
    registry = DatasetRegistry(MemoryKv())
    record, m = version("nlp/imagenet", "v1", b"x")
    with pytest.raises(InvalidSpec):
        await registry.add_version(VISION, record, m, frozenset())
    assert await registry.list() == []


JOB = """\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {{name: j}}
spec:
  gpuTypes: [A100]
  dataset: {dataset}
  tasks:
    - {{name: w, replicas: 1, image: "pytorch/pytorch:2.3", gpus: 1}}
"""


@pytest.mark.parametrize(
    ("dataset", "ref"),
    [
        ("imagenet", DatasetRef("imagenet")),
        ("imagenet@v3", DatasetRef("imagenet", "v3")),
        ("vision/imagenet@v3", DatasetRef("vision/imagenet", "v3")),
        ("{name: vision/imagenet, version: v3}", DatasetRef("vision/imagenet", "v3")),
    ],
)
def test_a_job_names_its_tenants_dataset_or_a_shared_one(dataset: str, ref: DatasetRef) -> None:
    spec = parse_manifest(JOB.format(dataset=dataset), priority_classes=DEFAULT_PRIORITY_CLASSES)
    assert spec.dataset == ref


@pytest.mark.parametrize(
    "dataset", ["a/b/imagenet", "/imagenet", "Vision/imagenet", "vision/", "x_y/imagenet"]
)
def test_a_job_naming_a_malformed_reference_is_refused(dataset: str) -> None:
    with pytest.raises(InvalidSpec, match=r"^spec\.dataset"):
        parse_manifest(JOB.format(dataset=dataset), priority_classes=DEFAULT_PRIORITY_CLASSES)


@pytest.mark.parametrize(
    ("tenant", "ref", "store"),
    [
        pytest.param("vision", DatasetRef("imagenet", "v1"), "vision-home", id="own-registered"),
        pytest.param("nlp", DatasetRef("imagenet", "v1"), "nlp-home", id="other-tenants-own"),
        pytest.param("speech", DatasetRef("imagenet", "v1"), "config-home", id="config-for-the-rest"),
        pytest.param("nlp", DatasetRef("vision/imagenet", "v1"), "vision-home", id="shared-by-name"),
        pytest.param("vision", DatasetRef("imagenet"), "vision-home", id="latest"),
    ],
)
async def test_the_placer_sees_the_dataset_the_jobs_tenant_means(
    tenant: str, ref: DatasetRef, store: str
) -> None:
    registry = DatasetRegistry(MemoryKv())
    for owner in (VISION, NLP):
        record, m = version("imagenet", "v1", owner.encode(), store=f"{owner}-home")
        await registry.add_version(owner, record, m, frozenset({NLP}) if owner == VISION else frozenset())
    seed = SchedulingSettings(
        datasets=(
            DatasetLocation("imagenet@v1", "config-home", 1),
            DatasetLocation("imagenet", "config-home", 1),
        )
    )
    settings = with_registry_locations(seed, await locations_reader(registry)())
    job = build_job("j", tenant=tenant, gpu="A100")
    job = replace(job, spec=replace(job.spec, dataset=ref))
    inputs = PlacerInputs(settings=settings, tenants=(), users={}, approvals=())
    assert gang_request(job, inputs).dataset_store == store


async def test_a_dataset_from_before_is_staged_and_shared_as_before(tmp_path: Path) -> None:
    """An old server's state: the dataset under /gpufed/datasets/<name> with its manifest. A job of its
    tenant naming it bare stages it where the old server put its copies (gpufed-cache/<name>/<v>/), and
    a job of the tenant it is shared with names it `owner/name` and uses that same copy."""
    w = _world(tmp_path, MemoryKv())
    await w.stores.put(StoreRecord("home", LocalStoreConfig(str(tmp_path / "home"))))
    await w.stores.put(StoreRecord("cloud", LocalStoreConfig(str(tmp_path / "cloud"))))
    try:
        home = await w.stores.client("home")
        await home.put("legacy/a.bin", b"L" * 2000)
        built = await build_manifest(home, "legacy/")
        record = DatasetVersion(
            DatasetName("legacy"), VersionId("v1"), StoreLocation(StoreName("home"), "legacy/"),
            built.digest, built.total_size_bytes, built.object_count, 1.0,
        )  # fmt: skip
        old = Dataset(DatasetName("legacy"), VISION, StoreName("home"), (record,), frozenset({NLP}))
        await w.kv.put(b"/gpufed/datasets/legacy", dataset_to_json(old))
        await w.kv.put(b"/gpufed/manifests/legacy/v1", manifest_to_json(built))

        first = staged_job("first", "legacy")
        assert (await w.stager.prepare(first)).kind is GateKind.STAGE
        assert await w.settle(first) is GateKind.READY
        assert (tmp_path / "cloud" / "gpufed-cache/legacy/v1/a.bin").read_bytes() == b"L" * 2000
        shared = replace(staged_job("shared", "vision/legacy"), tenant=NLP)
        assert (await w.stager.prepare(shared)).kind is GateKind.READY  # the same copy, now pinned
        (copy,) = (await w.registry.copies("cloud")).copies
        assert (copy.key.dataset, copy.pinned_by) == ("legacy", frozenset({"first", "shared"}))
        # A bare `legacy` is nlp's own, and nlp has none: nothing of vision's is staged for it.
        assert (
            await w.stager.prepare(replace(staged_job("bare", "legacy"), tenant=NLP))
        ).kind is GateKind.READY
        (copy,) = (await w.registry.copies("cloud")).copies
        assert "bare" not in copy.pinned_by
    finally:
        await w.stager.stop()
        await w.stores.close()
