"""Lineage through the Datasets servicer (issue 34): a three-step chain across two tenants, where
vision's `raw` is shared with nlp, nlp's job makes `clean` from it, and vision's job makes `tokens` from
nlp's `clean` (shared back). Each reader sees only what its tenant may: another tenant's unshared
version is redacted among ancestors and only counted among descendants, and who made a version (job,
images, parameters) is shown only to readers of the job's tenant."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest

from datasync import (
    DatasetName,
    DatasetVersion,
    Manifest,
    ManifestEntry,
    StoreLocation,
    StoreName,
    VersionId,
    dataset_to_json,
)
from datasync.store_config import LocalStoreConfig
from federation.api.datasets import DatasetService
from federation.api.v1 import gpufed_pb2 as pb
from federation.datasets.lineage import Lineage, LineageStore
from federation.datasets.registry import DatasetRegistry
from federation.datasets.stores import StoreDirectory, StoreRecord
from federation.datasets.syncs import SyncRecords
from federation.metrics import Metrics
from federation.security.auth import Authenticator
from federation.store.job_store import InMemoryJobStore
from federation.store.records import Role, TenantRecord, UserRecord
from federation.store.schema_version import stamp_json
from placement.model import TenantId


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


@dataclass
class Context:
    token: str

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),)

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


def _version(name: str, version: str, at_s: float) -> DatasetVersion:
    return DatasetVersion(
        DatasetName(name),
        VersionId(version),
        StoreLocation(StoreName("lab"), f"x/{name}/"),
        "d" * 64,
        1,
        1,
        at_s,
    )


MANIFEST = Manifest((ManifestEntry("a", 1, "0" * 64),))


def _made(dataset: str, version: str, tenant: str, job: str, inputs: tuple[str, ...]) -> Lineage:
    return Lineage(
        dataset, version, tenant, job, 1, job.split("-")[0], (f"{tenant}/img:1",), (("LR", "0.1"),),
        inputs, "lab", f"x/{dataset}/", 5.0,
    )  # fmt: skip


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[DatasetService]:
    store = InMemoryJobStore()
    for tenant in ("platform", "vision", "nlp", "audio"):
        await store.put_tenant(TenantRecord(TenantId(tenant)))
    for user, tenant, role in (
        ("admin", "platform", Role.ADMIN),
        ("alice", "vision", Role.MEMBER),
        ("bob", "nlp", Role.MEMBER),
        ("carol", "audio", Role.MEMBER),
    ):
        await store.put_user(UserRecord(user, TenantId(tenant), role))
        await store.put_token(f"{user}-token", user)
    registry = DatasetRegistry(store.kv)
    stores = StoreDirectory(store.kv)
    await stores.put(StoreRecord("lab", LocalStoreConfig(str(tmp_path))))
    vision, nlp = TenantId("vision"), TenantId("nlp")
    await registry.add_version(vision, _version("raw", "v1", 1.0), MANIFEST, frozenset({nlp}))
    await registry.add_version(nlp, _version("clean", "v1", 2.0), MANIFEST, frozenset({vision}))
    await registry.add_version(vision, _version("tokens", "v1", 3.0), MANIFEST, frozenset())
    await registry.add_version(nlp, _version("secret", "v1", 4.0), MANIFEST, frozenset())
    lineage = LineageStore(store.kv)
    await lineage.put(_made("nlp/clean", "v1", "nlp", "clean-job", ("vision/raw@v1",)))
    await lineage.put(_made("vision/tokens", "v1", "vision", "tok-job", ("nlp/clean@v1",)))
    # nlp also made an unshared dataset from vision's raw data: vision sees it counted, not named.
    await lineage.put(_made("nlp/secret", "v1", "nlp", "secret-job", ("vision/raw@v1",)))
    yield DatasetService(
        store=store,
        registry=registry,
        stores=stores,
        syncs=SyncRecords(store.kv),
        auth=Authenticator(store),
        metrics=Metrics(),
    )
    await stores.close()


async def lineage(service: DatasetService, user: str, name: str) -> pb.DatasetLineage:
    ref, _, version = name.partition("@")
    return await service.GetDatasetLineage(
        pb.GetDatasetLineageRequest(name=ref, version=version),
        Context(f"{user}-token"),  # type: ignore[arg-type]
    )


async def test_the_owner_sees_the_whole_chain_and_who_made_its_own_versions(service: DatasetService) -> None:
    seen = await lineage(service, "alice", "tokens@v1")
    assert (seen.version.dataset, seen.version.job_id, list(seen.version.params)) == (
        "vision/tokens",
        "tok-job",
        ["LR=0.1"],
    )
    assert [(n.dataset, n.depth) for n in seen.ancestors] == [("nlp/clean", 1), ("vision/raw", 2)]
    # nlp's clean is shared with vision: its data, not nlp's job.
    assert seen.ancestors[0].job_id == ""
    assert list(seen.ancestors[0].inputs) == ["vision/raw@v1"]
    assert not seen.descendants
    assert seen.hidden_descendants == 0


async def test_another_tenants_unshared_versions_are_counted_never_named(service: DatasetService) -> None:
    seen = await lineage(service, "alice", "raw@v1")
    assert [n.dataset for n in seen.descendants] == ["nlp/clean", "vision/tokens"]
    assert seen.hidden_descendants == 1  # nlp/secret
    assert "secret" not in str(seen)


async def test_a_reader_without_the_ancestors_sees_them_redacted(service: DatasetService) -> None:
    # bob (nlp) sees clean (his) and raw (shared with nlp), but not vision's unshared tokens.
    seen = await lineage(service, "bob", "clean@v1")
    assert seen.version.job_id == "clean-job"
    assert [n.dataset for n in seen.ancestors] == ["vision/raw"]
    assert seen.hidden_descendants == 1
    assert not seen.descendants
    # Another tenant's made-by is never shown, even where the version is.
    assert seen.ancestors[0].job_id == ""
    # A version made from something bob cannot see: vision/tokens is not his at all.
    with pytest.raises(Aborted) as hidden:
        await lineage(service, "bob", "vision/tokens@v1")
    assert hidden.value.code is grpc.StatusCode.NOT_FOUND


async def test_an_ancestor_the_reader_may_not_see_is_redacted_and_not_followed(
    service: DatasetService,
) -> None:
    # Make vision's raw unshared with nlp: bob's clean now comes from a version he may not see.
    registry = service._registry
    stored = await registry.get("vision/raw")
    assert stored is not None
    await registry.kv.put(
        b"/gpufed/datasets/vision/raw",
        stamp_json(dataset_to_json(replace(stored.value, shared_with=frozenset()))),
    )
    seen = await lineage(service, "bob", "clean@v1")
    assert [(n.redacted, n.dataset, n.depth) for n in seen.ancestors] == [(True, "", 1)]
    assert list(seen.version.inputs) == ["(redacted)"]
    assert "raw" not in str(seen)


async def test_carol_of_a_third_tenant_learns_nothing(service: DatasetService) -> None:
    for name in ("vision/raw@v1", "nlp/clean@v1", "vision/tokens@v1"):
        with pytest.raises(Aborted) as hidden:
            await lineage(service, "carol", name)
        assert hidden.value.code is grpc.StatusCode.NOT_FOUND
