"""Lineage of dataset versions made by jobs (issue 34): which job and attempt made a version, from
which input versions, with which images and parameters; and the walk a reader may see of it.

One record per version a job's output became, written before the version is registered (so a
restart finds it and knows the version is the job's): /gpufed/lineage/<tenant/name>/<version>.
Versions registered by hand have no record: their node has no job and no inputs.

What a reader sees is decided here, once: a version of a dataset the reader's tenant may not see
(another tenant's, unshared) is redacted (no name, nothing followed beyond it) among ancestors, and
only counted among descendants; who made a version (job, images, parameters) is shown only to readers
of the job's tenant, since a shared dataset's readers may see the data but not the owner's jobs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from datasync import Dataset, DatasetVersion, VersionId
from federation.store.kv import Compare, KeyValueStore, Put
from federation.store.schema_version import checked, dumps, loads, stamp_json

LINEAGE = b"/gpufed/lineage/"
# How far ancestry and descent are walked: a pipeline deeper than this is cut, not looped.
MAX_DEPTH = 32
REDACTED = "(redacted)"


@dataclass(frozen=True, slots=True)
class Lineage:
    """How a job made one version. `inputs` are `tenant/name@version` (the registry's names)."""

    dataset: str
    version: str
    tenant: str
    job_id: str
    attempt: int
    job_name: str
    images: tuple[str, ...]
    params: tuple[tuple[str, str], ...]
    inputs: tuple[str, ...]
    store: str
    prefix: str
    created_at_s: float
    job_set: str = ""


def lineage_key(dataset: str, version: str) -> bytes:
    return LINEAGE + f"{dataset}/{version}".encode()


def lineage_to_json(r: Lineage) -> bytes:
    doc = {
        "dataset": r.dataset,
        "version": r.version,
        "tenant": r.tenant,
        "job_id": r.job_id,
        "attempt": r.attempt,
        "job_name": r.job_name,
        "images": list(r.images),
        "params": [list(p) for p in r.params],
        "inputs": list(r.inputs),
        "store": r.store,
        "prefix": r.prefix,
        "created_at_s": r.created_at_s,
        "job_set": r.job_set,
    }
    return stamp_json(dumps(doc, sort_keys=True))


def lineage_from_json(value: bytes, key: bytes | None = None) -> Lineage:
    d = loads(checked(value, key), key)
    return Lineage(
        dataset=str(d["dataset"]),
        version=str(d["version"]),
        tenant=str(d["tenant"]),
        job_id=str(d["job_id"]),
        attempt=int(d["attempt"]),
        job_name=str(d["job_name"]),
        images=tuple(str(i) for i in d["images"]),
        params=tuple((str(k), str(v)) for k, v in d["params"]),
        inputs=tuple(str(i) for i in d["inputs"]),
        store=str(d["store"]),
        prefix=str(d["prefix"]),
        created_at_s=float(d["created_at_s"]),
        job_set=str(d.get("job_set", "")),
    )


class LineageStore:
    def __init__(self, kv: KeyValueStore) -> None:
        self._kv = kv

    async def get(self, dataset: str, version: str) -> Lineage | None:
        kv = await self._kv.get(lineage_key(dataset, version))
        return None if kv is None else lineage_from_json(kv.value, kv.key)

    async def put(self, record: Lineage) -> None:
        await self._kv.put(lineage_key(record.dataset, record.version), lineage_to_json(record))

    async def create(self, record: Lineage) -> Lineage:
        """Write `record` unless the version has a lineage already; the one that is kept. Two jobs
        declaring one version race here: the first to write is the one the version can be made by."""
        key = lineage_key(record.dataset, record.version)
        result = await self._kv.txn([Compare.absent(key)], [Put(key, lineage_to_json(record))])
        if result.succeeded:
            return record
        held = await self.get(record.dataset, record.version)
        return record if held is None else held

    async def list(self) -> list[Lineage]:
        page = await self._kv.range_prefix(LINEAGE)
        return [lineage_from_json(kv.value, kv.key) for kv in page.kvs]


# ---- the walk a reader may see


@dataclass(frozen=True, slots=True)
class Node:
    """One version as a reader sees it. `made_by` is None for a redacted node, for a version
    registered by hand, and when the reader may not read the job's tenant."""

    ref: str  # tenant/name@version, or "" when redacted
    depth: int
    redacted: bool = False
    version: DatasetVersion | None = None
    inputs: tuple[str, ...] = ()
    made_by: Lineage | None = None


@dataclass(frozen=True, slots=True)
class LineageView:
    node: Node
    ancestors: tuple[Node, ...] = ()
    descendants: tuple[Node, ...] = ()
    hidden_descendants: int = 0


def split_ref(ref: str) -> tuple[str, str]:
    name, _, version = ref.rpartition("@")
    return name, version


def walk(
    start: str,
    *,
    datasets: Iterable[Dataset],
    records: Iterable[Lineage],
    may_see: Callable[[Dataset], bool],
    may_read_tenant: Callable[[str], bool],
) -> LineageView:
    """Ancestors and descendants of `start` (`tenant/name@version`, a version the reader may see)."""
    by_name: dict[str, Dataset] = {str(d.name): d for d in datasets}
    made = {f"{r.dataset}@{r.version}": r for r in records}
    children: dict[str, list[str]] = {}
    for ref, r in sorted(made.items()):
        for parent in r.inputs:
            children.setdefault(parent, []).append(ref)

    def visible(ref: str) -> Dataset | None:
        name, _ = split_ref(ref)
        d = by_name.get(name)
        return d if d is not None and may_see(d) else None

    def node(ref: str, depth: int) -> Node:
        d = visible(ref)
        if d is None:
            return Node("", depth, redacted=True)
        made_it = made.get(ref)
        inputs = () if made_it is None else tuple(i if visible(i) else REDACTED for i in made_it.inputs)
        return Node(
            ref,
            depth,
            version=d.version(VersionId(split_ref(ref)[1])),
            inputs=inputs,
            made_by=made_it if made_it is not None and may_read_tenant(made_it.tenant) else None,
        )

    ancestors: list[Node] = []
    seen = {start}
    frontier = [start]
    for depth in range(1, MAX_DEPTH + 1):
        nxt: list[str] = []
        for ref in frontier:
            maker = made.get(ref)
            for parent in () if maker is None else maker.inputs:
                if parent in seen:
                    continue
                seen.add(parent)
                n = node(parent, depth)
                ancestors.append(n)
                if not n.redacted:  # nothing beyond a version the reader may not see
                    nxt.append(parent)
        frontier = nxt
    descendants: list[Node] = []
    hidden = 0
    seen = {start}
    frontier = [start]
    for depth in range(1, MAX_DEPTH + 1):
        nxt = []
        for ref in frontier:
            for child in children.get(ref, ()):
                if child in seen:
                    continue
                seen.add(child)
                if visible(child) is None:
                    hidden += 1
                    continue
                descendants.append(node(child, depth))
                nxt.append(child)
        frontier = nxt
    return LineageView(node(start, 0), tuple(ancestors), tuple(descendants), hidden)
