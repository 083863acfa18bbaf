"""Placement rules (issue 32): a job may require or exclude clusters, regions and clouds, and a gang
whose tasks differ goes only where Volcano runs it. The placer honours both, explain says when they
are why a job waits, and neither teaches a tenant anything about the federation it could not learn
from an unpinned job."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
import yaml

from clusters.kubernetes.manifests import uniform_replica
from federation.errors import InvalidSpec
from federation.scheduling.snapshot import uniform
from federation.scheduling.workload import workload_for
from federation.spec.jobspec import TaskSpec
from federation.spec.priorities import DEFAULT_PRIORITY_CLASSES
from federation.spec.training_job import parse_manifest, render_manifest
from federation.store.jobs import JobPlacement
from placement.model import (
    CapacityKind,
    ClusterName,
    ClusterState,
    GangRequest,
    GpuType,
    JobPhase,
    Pinning,
    Plan,
    Provider,
    WaitCode,
)
from placement.plan import plan
from tests.conftest import build_job
from tests.unit.placement_builders import a_cluster, a_gang, a_snapshot


def _clusters() -> list[ClusterState]:
    return [
        a_cluster("onprem").pool("A100", nodes=1, price=1.0).build(),
        a_cluster("aws-use1").provider(Provider.AWS, "us-east-1").pool("A100", nodes=2, price=2.0).build(),
        a_cluster("gcp-euw4").provider(Provider.GCP, "europe-west4").pool("A100", nodes=2, price=3.0).build(),
        a_cluster("gcp-use4").provider(Provider.GCP, "us-east4").pool("H100", nodes=2, price=5.0).build(),
    ]


def _job(job_id: str = "j", **pinning: tuple[str, ...]) -> GangRequest:
    return replace(a_gang(job_id).gang(1, gpus=8, gpu="A100").build(), pinning=Pinning(**pinning))


def _plan(*gangs: GangRequest, clusters: list[ClusterState] | None = None) -> Plan:
    return plan(a_snapshot().queue(*gangs).clusters(*(clusters or _clusters())).build(), now=0.0)


@pytest.mark.parametrize(
    ("rules", "cluster"),
    [
        ({}, "onprem"),  # the cheapest
        ({"regions": ("europe-west4",)}, "gcp-euw4"),
        ({"exclude_clouds": ("private",)}, "aws-use1"),
        ({"clouds": ("gcp",)}, "gcp-euw4"),
        ({"exclude_clusters": ("onprem", "aws-use1")}, "gcp-euw4"),
        ({"clusters": ("aws-use1", "gcp-euw4")}, "aws-use1"),
        ({"exclude_regions": ("local", "us-east-1")}, "gcp-euw4"),
    ],
)
def test_the_placer_honours_required_and_excluded_clusters_regions_and_clouds(
    rules: dict[str, tuple[str, ...]], cluster: str
) -> None:
    assert [a.cluster for a in _plan(replace(_job(), pinning=Pinning(**rules))).admissions] == [cluster]


def test_a_job_pinned_where_there_is_no_room_waits_and_explain_says_why() -> None:
    clusters = _clusters()
    clusters[2] = (
        a_cluster("gcp-euw4").provider(Provider.GCP, "europe-west4").pool("A100", free=[0, 0]).build()
    )
    result = _plan(_job(regions=("europe-west4",)), clusters=clusters)
    assert not result.admissions
    (waiting,) = result.waiting
    codes = [r.code for r in waiting.reasons]
    assert codes[0] is WaitCode.PLACEMENT_RULES
    assert waiting.reasons[0].message == (
        "clusters aws-use1, onprem ruled out by the job's placement rules (spec.placement)"
    )
    # The capacity reason speaks only of the cluster it may use.
    assert {r.cluster for r in waiting.reasons if r.code is WaitCode.INSUFFICIENT_CAPACITY} == {"gcp-euw4"}


def test_pinning_names_no_cluster_an_unpinned_job_is_not_told_of() -> None:
    """What a tenant could learn: a pin to a name it guessed reads the same whether that cluster
    exists (without the GPUs asked for) or not, and names only clusters that have those GPUs."""
    full = [
        a_cluster("onprem").pool("A100", free=[0]).build(),
        a_cluster("aws-use1").provider(Provider.AWS, "us-east-1").pool("A100", free=[0, 0]).build(),
        a_cluster("gcp-use4").provider(Provider.GCP, "us-east4").pool("H100", nodes=2).build(),
    ]
    every = ["onprem", "aws-use1", "gcp-use4", "no-such-cluster"]

    def named(reasons: tuple[Any, ...]) -> set[str]:
        return {name for name in every for r in reasons if name in r.message or r.cluster == name}

    told = named(_plan(_job(), clusters=full).waiting[0].reasons)
    assert told == {"onprem", "aws-use1"}
    replies = []
    for guess in ("gcp-use4", "no-such-cluster"):  # exists with H100 only / does not exist
        reasons = _plan(_job(clusters=(guess,)), clusters=full).waiting[0].reasons
        assert named(reasons) - {guess} <= told
        replies.append([r.message for r in reasons])
    assert replies[0] == replies[1]


def test_a_gang_whose_tasks_differ_goes_only_where_volcano_runs_it() -> None:
    cheap = a_cluster("indexed-only").pool("A100", nodes=2, price=1.0).build()
    volcano = a_cluster("volcano").pool("A100", nodes=2, price=2.0).build()
    mixed = replace(a_gang("mixed").replicas(0, 8, 8).gpus("A100").build(), uniform=False)
    result = _plan(mixed, clusters=[replace(cheap, runs_mixed_gangs=False), volcano])
    assert [a.cluster for a in result.admissions] == ["volcano"]
    # With no Volcano anywhere it waits, saying why, and is never sent to be refused.
    alone = _plan(mixed, clusters=[replace(cheap, runs_mixed_gangs=False)])
    assert not alone.admissions
    (reason,) = [r for r in alone.waiting[0].reasons if r.code is WaitCode.PLACEMENT_RULES]
    assert "needs Volcano" in reason.message
    assert "indexed-only" in reason.message
    # A uniform gang still takes the cheaper cluster.
    uniform = a_gang("uniform").gang(2, gpus=8, gpu="A100").build()
    assert [
        a.cluster
        for a in _plan(uniform, clusters=[replace(cheap, runs_mixed_gangs=False), volcano]).admissions
    ] == ["indexed-only"]


def test_pinned_and_unpinned_gangs_never_share_a_decision() -> None:
    """The placer reuses a wait for gangs with equal decision keys: a pin is part of the key."""
    gangs = [_job(f"free{i}") for i in range(4)] + [
        _job(f"eu{i}", regions=("europe-west4",)) for i in range(3)
    ]
    result = _plan(*gangs)
    assert len(result.admissions) == 5  # every node of an A100 cluster
    assert {a.cluster for a in result.admissions if a.job_id.startswith("eu")} == {"gcp-euw4"}
    for waiting in result.waiting:
        pinned = waiting.job_id.startswith("eu")
        assert (waiting.reasons[0].code is WaitCode.PLACEMENT_RULES) == pinned, waiting


def test_random_rules_are_never_broken() -> None:
    rng = random.Random(32)
    clusters = _clusters()
    sites = {c.name: (c.region, c.provider.value) for c in clusters}
    names, regions, clouds = (
        list(sites),
        sorted({r for r, _ in sites.values()}),
        sorted({p.value for p in Provider}),
    )
    for trial in range(200):
        rules: dict[str, tuple[str, ...]] = {}
        for key, pool in (
            ("clusters", names),
            ("exclude_clusters", names),
            ("regions", regions),
            ("exclude_regions", regions),
            ("clouds", clouds),
            ("exclude_clouds", clouds),
        ):
            if rng.random() < 0.3:
                rules[key] = tuple(sorted(rng.sample(pool, rng.randint(1, 2))))
        pinning = Pinning(**rules)
        gangs = [replace(_job(f"g{trial}-{i}"), pinning=pinning if i % 2 else Pinning()) for i in range(4)]
        for admission in _plan(*gangs, clusters=clusters).admissions:
            gang = next(g for g in gangs if g.job_id == admission.job_id)
            region, cloud = sites[admission.cluster]
            assert gang.pinning.allows(admission.cluster, region, cloud), (rules, admission)


# ---- the manifest


def _manifest(placement: object) -> str:
    doc = {
        "apiVersion": "gpufed.io/v1",
        "kind": "TrainingJob",
        "metadata": {"name": "j"},
        "spec": {
            "gpuTypes": ["A100"],
            "placement": placement,
            "tasks": [{"name": "w", "replicas": 1, "image": "busybox", "gpus": 8}],
        },
    }
    return yaml.safe_dump(doc)


def test_placement_rules_round_trip_through_the_canonical_manifest() -> None:
    spec = parse_manifest(
        _manifest({"regions": ["europe-west4", "europe-west1"], "excludeClouds": ["aws"]}),
        priority_classes=DEFAULT_PRIORITY_CLASSES,
    )
    assert spec.pinning == Pinning(regions=("europe-west1", "europe-west4"), exclude_clouds=("aws",))
    assert parse_manifest(render_manifest(spec), priority_classes=DEFAULT_PRIORITY_CLASSES) == spec


@pytest.mark.parametrize(
    ("placement", "field", "words"),
    [
        ({"region": ["eu"]}, "spec.placement.region", "unknown field"),
        ({"clouds": ["azure", "ibm"]}, "spec.placement.clouds[1]", "must be one of"),
        ({"clusters": "onprem"}, "spec.placement.clusters", "must be a list"),
        ({"clusters": ["Bad_Name"]}, "spec.placement.clusters[0]", "cluster or region name"),
        ({"clusters": ["a"], "excludeClusters": ["a"]}, "spec.placement", "both required and excluded"),
        (["eu"], "spec.placement", "must be a mapping"),
    ],
)
def test_bad_rules_are_refused_naming_the_field(placement: object, field: str, words: str) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_manifest(_manifest(placement), priority_classes=DEFAULT_PRIORITY_CLASSES)
    assert caught.value.field == field
    assert words in caught.value.rule


def _task(name: str, **changes: Any) -> TaskSpec:
    task = TaskSpec(name, 1, "busybox", ("python", "train.py"), (("EPOCHS", "3"),), 8)
    return replace(task, **changes)


@pytest.mark.parametrize(
    "tasks",
    [
        (_task("worker", replicas=4),),
        (_task("master"), _task("worker", replicas=3)),  # named apart, run the same pod
        (_task("master", gpus_per_replica=0), _task("worker", replicas=2)),
        (_task("master", image="other"), _task("worker")),
        (_task("master", command=("mpirun",)), _task("worker")),
        (_task("master", env=(("ROLE", "m"),)), _task("worker")),
        (_task("master", template='{"spec":{"containers":[{"name":"m"}]}}'), _task("worker")),
        (_task("master", shm_size="16Gi"), _task("worker")),
    ],
    ids=["one-task", "same-pod", "gpus", "image", "command", "env", "template", "shm"],
)
def test_the_placer_reads_a_gang_as_differing_exactly_when_the_backend_would_refuse_it(
    tasks: tuple[TaskSpec, ...],
) -> None:
    """`snapshot.uniform` must agree with what the Kubernetes backend can run as an Indexed Job."""
    job = build_job("j", tasks=tasks)
    placed = replace(
        job,
        phase=JobPhase.ADMITTED,
        placement=JobPlacement(ClusterName("c"), GpuType("A100"), CapacityKind.PRIVATE, 1.0),
    )
    assert uniform(job.spec) == (uniform_replica(workload_for(placed)) is not None)


def test_room_is_made_only_where_the_rules_allow() -> None:
    """Evictions and capacity requests for a pinned gang happen only on clusters it may use, though
    the cluster it may not use is cheaper and first by name (without the rule, room is made there)."""
    here = (
        a_cluster("a-excluded")
        .pool("A100", free=[0], name="p", price=0.5)
        .scalable("A100", max_nodes=4, price=1.0)
    )
    there = (
        a_cluster("b-allowed")
        .provider(Provider.GCP, "europe-west4")
        .pool("A100", free=[0], name="p", price=2.0)
    )
    there = there.scalable("A100", max_nodes=4, price=3.0)

    def made(pinning: Pinning) -> tuple[list[str], list[str]]:
        snapshot = (
            a_snapshot()
            .queue(replace(_job("hi"), priority=100, pinning=pinning))
            .clusters(here, there)
            .running("low-here", cluster="a-excluded", nodes=[("p", 0, 8)])
            .running("low-there", cluster="b-allowed", nodes=[("p", 0, 8)])
            .build()
        )
        evicting = [str(p.victim) for p in plan(snapshot, now=0.0).preemptions]
        growing = plan(replace(snapshot, policy=replace(snapshot.policy, preemption=False)), now=0.0)
        return evicting, [r.cluster for r in growing.capacity_requests]

    assert made(Pinning()) == (["low-here"], ["a-excluded"])
    assert made(Pinning(clusters=("b-allowed",))) == (["low-there"], ["b-allowed"])
    assert made(Pinning(regions=("europe-west4",))) == (["low-there"], ["b-allowed"])
