"""The submission path's shortcuts (issue 33) answer exactly as the work they save.

A task's pod is checked against its tenant's pod security level once per (tenant, pod text, level)
(`federation.api.submit_checks`): a burst of submissions repeats a few templates thousands of
times. Held here to the uncached check, in every level and order, refusals in the same words; and
a tenant's verdicts are its own, so another cannot learn by timing that it sent the same pod.

The group commit's flusher lets the callers woken in its turn of the event loop join its batch
(`federation.store.group_commit`): fewer, larger requests to etcd.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest

from federation.api import submit_checks
from federation.api.submit_checks import check_submission
from federation.errors import InvalidSpec
from federation.spec.jobspec import PodSecurityLevel, TrainingJobSpec
from federation.spec.pod_security import Violation, check_pod
from federation.spec.pod_template import expanded_template
from federation.spec.priorities import DEFAULT_PRIORITY_CLASSES
from federation.spec.training_job import parse_manifest
from federation.store.group_commit import GroupCommit
from federation.store.kv import TxnResult
from federation.store.records import SchedulingSettings, TenantRecord
from placement.model import TenantId
from tests.unit.test_group_commit import CountingKv, create
from tests.unit.test_pod_security import CASES, RESTRICTED_OK

LEVELS = list(PodSecurityLevel)
SETTINGS = SchedulingSettings()


def a_spec(*templates: dict[str, Any] | None, shm_size: str = "") -> TrainingJobSpec:
    tasks: list[dict[str, Any]] = []
    for i, template in enumerate(templates):
        task: dict[str, Any] = {"name": f"t{i}", "replicas": 1, "gpus": 1}
        if template is None:
            task["image"] = "busybox"
        else:
            task["template"] = with_image(template, "busybox")
        if shm_size:
            task["shmSize"] = shm_size
        tasks.append(task)
    doc = {
        "apiVersion": "gpufed.io/v1",
        "kind": "TrainingJob",
        "metadata": {"name": "j"},
        "spec": {"gpuTypes": ["A100"], "tasks": tasks},
    }
    return parse_manifest(json.dumps(doc), priority_classes=DEFAULT_PRIORITY_CLASSES.keys())


def outcome(
    spec: TrainingJobSpec, level: PodSecurityLevel, tenant: str = "vision"
) -> tuple[str, str] | PodSecurityLevel:
    try:
        return check_submission(
            spec, TenantRecord(name=TenantId(tenant), pod_security=level), SETTINGS
        ).pod_security
    except InvalidSpec as error:
        return error.field, error.rule


def uncached(spec: TrainingJobSpec, level: PodSecurityLevel) -> tuple[str, str] | PodSecurityLevel:
    """What check_submission said before its verdicts were kept: each pod decoded and checked."""
    for i, task in enumerate(spec.tasks):
        text = expanded_template(task.template, task.shm_size or None) or '{"spec":{"containers":[{}]}}'
        try:
            check_pod(json.loads(text), level)
        except Violation as v:
            return (
                f"spec.tasks[{i}].template.{v.field}",
                f"{v.rule} (tenant 'vision' is at pod security level {level.value!r}; "
                "an admin sets it with the tenant's podSecurity)",
            )
    return level


TEMPLATES: list[dict[str, Any] | None] = [None, RESTRICTED_OK, *(case[1] for case in CASES)]


@pytest.mark.parametrize("level", LEVELS, ids=str)
def test_kept_verdicts_say_what_the_check_says_in_any_order(level: PodSecurityLevel) -> None:
    submit_checks._kept_verdict.cache_clear()
    # Twice over, both orders and every level interleaved: a verdict kept for one level or one
    # template must never answer for another.
    for round_ in range(2):
        for template in TEMPLATES if round_ == 0 else reversed(TEMPLATES):
            for each in (level, *LEVELS):
                for shm in ("", "8Gi"):
                    spec = a_spec(template, shm_size=shm)
                    assert outcome(spec, each) == uncached(spec, each)
    assert submit_checks._kept_verdict.cache_info().hits > 0


def test_a_later_task_is_refused_by_its_own_index_when_the_first_was_kept_as_fine() -> None:
    privileged = {"spec": {"containers": [{"name": "main", "securityContext": {"privileged": True}}]}}
    spec = a_spec(None, privileged)
    assert outcome(a_spec(None), PodSecurityLevel.BASELINE) is PodSecurityLevel.BASELINE
    refused = outcome(spec, PodSecurityLevel.BASELINE)
    assert isinstance(refused, tuple)
    assert refused[0] == "spec.tasks[1].template.spec.containers[0].securityContext.privileged"
    assert outcome(spec, PodSecurityLevel.PRIVILEGED) is PodSecurityLevel.PRIVILEGED


def test_a_template_too_long_to_keep_is_checked_each_time() -> None:
    big = json.loads(json.dumps(RESTRICTED_OK))
    big["metadata"] = {"annotations": {"note": "x" * (submit_checks._VERDICT_TEXT_MAX + 1)}}
    submit_checks._kept_verdict.cache_clear()
    spec = a_spec(big)
    for level in LEVELS:
        assert outcome(spec, level) == uncached(spec, level)
    assert submit_checks._kept_verdict.cache_info().currsize == 0
    # Held within its bound however many templates pass.
    for n in range((submit_checks._kept_verdict.cache_info().maxsize or 0) + 10):
        template = with_image(RESTRICTED_OK, f"img{n}")
        outcome(a_spec(template), PodSecurityLevel.RESTRICTED)
    info = submit_checks._kept_verdict.cache_info()
    assert info.maxsize is not None
    assert info.currsize <= info.maxsize


def with_image(template: dict[str, Any], image: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(template))
    for key in ("containers", "initContainers", "ephemeralContainers"):
        for c in out["spec"].get(key, []):
            c.setdefault("image", image)
    return out


def test_a_tenants_kept_verdicts_are_its_own() -> None:
    """Another tenant's identical pod is checked afresh (no hit a timing could show), and each
    refusal names the tenant that made it."""
    privileged = {"spec": {"containers": [{"name": "main", "securityContext": {"privileged": True}}]}}
    spec = a_spec(privileged)
    submit_checks._kept_verdict.cache_clear()
    alice = outcome(spec, PodSecurityLevel.BASELINE, tenant="alice")
    assert submit_checks._kept_verdict.cache_info().hits == 0
    bob = outcome(spec, PodSecurityLevel.BASELINE, tenant="bob")
    assert submit_checks._kept_verdict.cache_info().hits == 0
    assert submit_checks._kept_verdict.cache_info().misses == 2
    assert isinstance(alice, tuple)
    assert isinstance(bob, tuple)
    assert "tenant 'alice'" in alice[1]
    assert "tenant 'bob'" in bob[1]
    assert "alice" not in bob[1]
    # Alice's own second submission is the one answered from what was kept.
    assert outcome(spec, PodSecurityLevel.BASELINE, tenant="alice") == alice
    assert submit_checks._kept_verdict.cache_info().hits == 1


def test_the_stored_spec_is_the_one_given_with_the_tenants_level() -> None:
    spec = a_spec(RESTRICTED_OK)
    stored = check_submission(
        spec, TenantRecord(name=TenantId("vision"), pod_security=PodSecurityLevel.RESTRICTED), SETTINGS
    )
    assert stored == replace(spec, pod_security=PodSecurityLevel.RESTRICTED)


# ---- group commit: callers woken in the same turn of the event loop share one request


async def test_callers_woken_in_the_flushers_turn_join_its_batch() -> None:
    kv = CountingKv()
    group = GroupCommit(kv, max_batch=16)
    woken = asyncio.Event()

    async def after_the_first(key: bytes) -> TxnResult:
        await woken.wait()
        return await group.run(create(key))

    late = [asyncio.create_task(after_the_first(f"/k/{i}".encode())) for i in range(7)]
    await asyncio.sleep(0)  # the seven wait on the event
    first = asyncio.create_task(group.run(create(b"/k/first")))
    await asyncio.sleep(0)  # the first is pending and the flusher is queued; now wake the rest
    woken.set()
    results = await asyncio.gather(first, *late)
    assert all(r.succeeded for r in results)
    # Queued behind the flusher, the seven would have gone in a second request.
    assert kv.requests == [8]


async def test_a_lone_transaction_still_goes_in_a_request_of_its_own() -> None:
    kv = CountingKv()
    group = GroupCommit(kv)
    result = await group.run(create(b"/k/alone"))
    assert result.succeeded
    assert kv.requests == [1]
