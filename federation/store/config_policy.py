"""The placer's inputs as written in the federation config and in admin requests.

Tenants (tree, quotas, weight, budget, highest class), priority classes, GPU speeds, egress rates,
dataset locations and the policy knobs. The same readers serve the config file that `gpufed up`
loads and the documents an admin sends with `gpufed tenant set -f`, so both give the same errors,
each naming its field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields, replace
from typing import Any

from federation.errors import InvalidSpec
from federation.spec.jobspec import PodSecurityLevel
from federation.spec.validate import int_field, name_field, number_field
from federation.store.records import (
    DEFAULT_MAX_QUEUED_JOBS,
    DEFAULT_MAX_QUEUED_JOBS_PER_TENANT,
    DatasetLocation,
    SchedulingSettings,
    TenantRecord,
)
from placement.gpu_types import BUILTIN_TYPES, GpuModel
from placement.model import EgressRate, GpuQuota, GpuType, PolicyConfig, PriorityClass, TenantId
from placement.model_policy import CostPolicy

# Config key -> PolicyConfig field, for the knobs an operator sets. Seconds and hours are spelled
# out in the key as the rest of the config does.
_POLICY_KEYS: dict[str, str] = {
    "preemption": "preemption",
    "preemptionLimitGpus": "preemption_limit_gpus",
    "defaultGracePeriodSeconds": "default_grace_period_s",
    "waitValueUsdPerHour": "wait_value_usd_per_hour",
    "privateWaitSecondsPerGpuHour": "private_wait_s_per_gpu_hour",
    "privateWaitMaxSeconds": "private_wait_max_s",
    "privateWaitNeedsStart": "private_wait_needs_start",
    "privateWaitNeedsStartMaxRunHours": "private_wait_needs_start_max_run_h",
    "privateWaitNeedsStartAfterSeconds": "private_wait_needs_start_after_s",
    "privateWaitDeadlineMarginSeconds": "private_wait_deadline_margin_s",
    "privateRateSunk": "private_rate_sunk",
    "privateWaitReserve": "private_wait_reserve",
    "privateWaitReservations": "private_wait_reservations",
    "repatriate": "repatriate",
    "repatriateMinSavingUsd": "repatriate_min_saving_usd",
    "moveOverheadSeconds": "move_overhead_s",
    "fairShareHistory": "fair_share_history",
    "historyHorizonHours": "history_horizon_h",
    "backfill": "backfill",
    "defaultRuntimeSeconds": "default_runtime_s",
    "spotLostWorkHours": "spot_lost_work_h",
    "spotMaxRestartSlowdown": "spot_max_restart_slowdown",
    "preferPrivate": "prefer_private",
    "defaultEgressUsdPerGb": "default_egress_usd_per_gb",
    "transferBytesPerSecond": "transfer_bytes_per_s",
}
_TENANT_KEYS = frozenset(
    {
        "name",
        "gpuCaps",
        "parent",
        "quotas",
        "weight",
        "monthlyBudgetGpuHours",
        "maxPriorityClass",
        "submitRateLimit",
        "maxQueuedJobs",
        "podSecurity",
        "costPolicy",
    }
)
_QUOTA_KEYS = frozenset({"guaranteed", "borrowingLimit", "lendingLimit", "cap"})

# Upper bounds on what a tenant document or the config sets (issue 30: a weight of 1e308 was taken,
# and overflowed the placer's share arithmetic to infinity). A weight is relative: 0.001 to 1000 is
# a million to one between two tenants, wider than any fair-share setup needs (AWS Batch takes share
# weights from 0.0001 to 999.9999; Kueue's `fairSharing.weight` is a quantity whose weighted share
# saturates at the int64 maximum, and Slurm's Fairshare raw shares are 32-bit integers, ~4.3e9).
MAX_WEIGHT = 1000.0
# The largest queue limit a document may set (`maxQueuedJobs`): far past what any server's memory
# holds (docs/deploy.md, "Sizing"), but a number, so that a typo of a few more digits is refused.
MAX_QUEUED_JOBS_LIMIT = 100_000_000
MIN_WEIGHT = 0.001
# GPUs in a cap, a quota or a policy limit: beyond any fleet (a million GPUs).
MAX_GPUS = 1_000_000
# GPU-hours a month: a million GPUs for the longest month.
MAX_BUDGET_GPU_HOURS = MAX_GPUS * 31 * 24.0
# Submissions per second a tenant may be allowed, and their burst.
MAX_SUBMIT_RATE_PER_S = 10_000.0
MAX_SUBMIT_BURST = 1_000_000
# A priority class's value: Kubernetes' own ceiling for user-defined PriorityClasses (1e9).
MAX_CLASS_VALUE = 1_000_000_000
# How much faster one GPU type may be said to be than the reference.
MAX_GPU_SPEED = 1000.0
MAX_USD = 1_000_000.0
MAX_SECONDS = 366 * 24 * 3600.0
MAX_HOURS = 10 * 366 * 24.0
MAX_COUNT = 1_000_000
MAX_DATASET_GIB = 1_000_000_000.0  # an exbibyte
MAX_BYTES_PER_S = 1e12  # a terabyte a second


def _policy_maximum(key: str) -> float:
    """The bound of a `policy:` knob, by the unit its key spells out."""
    if key == "spotMaxRestartSlowdown":
        return 1000.0
    if key == "transferBytesPerSecond":
        return MAX_BYTES_PER_S
    if "Usd" in key:
        return MAX_USD
    if key.endswith("Gpus"):
        return float(MAX_GPUS)
    if "Seconds" in key:
        return MAX_SECONDS
    if key.endswith("Hours"):
        return MAX_HOURS
    return float(MAX_COUNT)


def _mapping(value: Any, field: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidSpec(field, "must be a mapping")
    return value


def _unknown_keys(doc: Mapping[str, Any], allowed: Iterable[str], at: str) -> None:
    unknown = sorted(set(doc) - set(allowed))
    if unknown:
        raise InvalidSpec(f"{at}.{unknown[0]}", f"is not a known field (known: {', '.join(sorted(allowed))})")


def _optional_count(value: Any, field: str) -> int | None:
    return None if value is None else int_field(value, field, minimum=0, maximum=MAX_GPUS)


def parse_quotas(value: Any, at: str) -> tuple[GpuQuota, ...]:
    """`quotas: {A100: {guaranteed: 16, borrowingLimit: 8, lendingLimit: 16, cap: 32}}`."""
    quotas = []
    for gpu_type, q in sorted(_mapping(value, at).items()):
        qat = f"{at}.{gpu_type}"
        q = _mapping(q, qat)
        _unknown_keys(q, _QUOTA_KEYS, qat)
        quota = GpuQuota(
            gpu_type=GpuType(str(gpu_type)),
            guaranteed_gpus=int_field(
                q.get("guaranteed", 0), f"{qat}.guaranteed", minimum=0, maximum=MAX_GPUS
            ),
            borrowing_limit_gpus=_optional_count(q.get("borrowingLimit"), f"{qat}.borrowingLimit"),
            lending_limit_gpus=_optional_count(q.get("lendingLimit"), f"{qat}.lendingLimit"),
            cap_gpus=_optional_count(q.get("cap"), f"{qat}.cap"),
        )
        if quota.cap_gpus is not None and quota.cap_gpus < quota.guaranteed_gpus:
            raise InvalidSpec(
                f"{qat}.cap", f"{quota.cap_gpus} is below the guarantee ({quota.guaranteed_gpus})"
            )
        if quota.lending_limit_gpus is not None and quota.lending_limit_gpus > quota.guaranteed_gpus:
            raise InvalidSpec(
                f"{qat}.lendingLimit", f"cannot lend more than the guarantee ({quota.guaranteed_gpus})"
            )
        quotas.append(quota)
    return tuple(quotas)


def parse_tenant(doc: Any, at: str, *, priority_classes: Iterable[str]) -> TenantRecord:
    t = _mapping(doc, at)
    _unknown_keys(t, _TENANT_KEYS, at)
    caps = _mapping(t.get("gpuCaps"), f"{at}.gpuCaps")
    parent = t.get("parent")
    budget = t.get("monthlyBudgetGpuHours")
    max_class = t.get("maxPriorityClass")
    if max_class is not None and max_class not in set(priority_classes):
        raise InvalidSpec(f"{at}.maxPriorityClass", f"{max_class!r} is not a priority class")
    rate_s, burst = _submit_rate_limit(t.get("submitRateLimit"), f"{at}.submitRateLimit")
    return TenantRecord(
        name=TenantId(name_field(t.get("name"), f"{at}.name")),
        gpu_caps=tuple(
            sorted(
                (GpuType(str(g)), int_field(n, f"{at}.gpuCaps.{g}", minimum=0, maximum=MAX_GPUS))
                for g, n in caps.items()
            )
        ),
        parent=None if parent is None else TenantId(name_field(parent, f"{at}.parent")),
        quotas=parse_quotas(t.get("quotas"), f"{at}.quotas"),
        weight=number_field(t.get("weight", 1.0), f"{at}.weight", minimum=MIN_WEIGHT, maximum=MAX_WEIGHT),
        monthly_budget_gpu_hours=None
        if budget is None
        else number_field(budget, f"{at}.monthlyBudgetGpuHours", minimum=0, maximum=MAX_BUDGET_GPU_HOURS),
        max_priority_class=max_class,
        submit_rate_per_s=rate_s,
        submit_burst=burst,
        max_queued_jobs=_queue_limit(t.get("maxQueuedJobs"), f"{at}.maxQueuedJobs"),
        pod_security=_pod_security(t.get("podSecurity"), f"{at}.podSecurity"),
        cost_policy=_cost_policy(t.get("costPolicy"), f"{at}.costPolicy"),
    )


def _cost_policy(value: Any, at: str) -> CostPolicy:
    """How long the tenant's jobs wait for private GPUs before paying cloud prices (balanced when not
    given): docs/placement.md, "Per tenant and per job"."""
    if value is None:
        return CostPolicy.BALANCED
    names = [policy.value for policy in CostPolicy]
    if value not in names:
        raise InvalidSpec(at, f"must be one of {', '.join(names)}, got {value!r}")
    return CostPolicy(value)


def _pod_security(value: Any, at: str) -> PodSecurityLevel:
    """A Pod Security Standards level: what the tenant's pods may do (baseline when not given)."""
    if value is None:
        return PodSecurityLevel.BASELINE
    levels = [level.value for level in PodSecurityLevel]
    if value not in levels:
        raise InvalidSpec(at, f"must be one of {', '.join(levels)}, got {value!r}")
    return PodSecurityLevel(value)


def _queue_limit(value: Any, at: str) -> int | None:
    """A limit on queued jobs (`maxQueuedJobs`): a count of at least 1; absent or null, none."""
    return None if value is None else int_field(value, at, minimum=1, maximum=MAX_QUEUED_JOBS_LIMIT)


def _policy_queue_limit(policy_doc: Mapping[str, Any], key: str, default: int) -> int | None:
    """`policy.<key>`, a queue limit: not given, `default`; null lifts it."""
    return _queue_limit(policy_doc[key], f"policy.{key}") if key in policy_doc else default


def _submit_rate_limit(doc: Any, at: str) -> tuple[float | None, int | None]:
    """`{perSecond: 20, burst: 100}`: the burst defaults to twice the rate (at least 1)."""
    if doc is None:
        return None, None
    d = _mapping(doc, at)
    _unknown_keys(d, frozenset({"perSecond", "burst"}), at)
    rate = number_field(d.get("perSecond"), f"{at}.perSecond", minimum=0.001, maximum=MAX_SUBMIT_RATE_PER_S)
    burst = d.get("burst")
    if burst is None:
        return rate, max(1, int(rate * 2))
    return rate, int_field(burst, f"{at}.burst", minimum=1, maximum=MAX_SUBMIT_BURST)


def check_tenant_tree(tenants: Iterable[TenantRecord], at: str = "tenants") -> None:
    """Every parent exists and no tenant is its own ancestor."""
    by_name = {t.name: t for t in tenants}
    for i, tenant in enumerate(by_name.values()):
        seen = {tenant.name}
        node = tenant
        while node.parent is not None:
            if node.parent not in by_name:
                raise InvalidSpec(f"{at}[{i}].parent", f"tenant {node.parent!r} is not defined")
            if node.parent in seen:
                raise InvalidSpec(f"{at}[{i}].parent", f"tenant {tenant.name!r} would be its own ancestor")
            seen.add(node.parent)
            node = by_name[node.parent]


def parse_priority_classes(value: Any, at: str = "priorityClasses") -> tuple[PriorityClass, ...]:
    if value is None:
        return SchedulingSettings().priority_classes
    if not isinstance(value, list) or not value:
        raise InvalidSpec(at, "must be a non-empty list of {name, value}")
    classes = []
    for i, c in enumerate(value):
        cat = f"{at}[{i}]"
        c = _mapping(c, cat)
        _unknown_keys(c, ("name", "value", "preemptible", "needsApproval"), cat)
        for flag in ("preemptible", "needsApproval"):
            if flag in c and not isinstance(c[flag], bool):
                raise InvalidSpec(f"{cat}.{flag}", f"must be true or false, got {c[flag]!r}")
        classes.append(
            PriorityClass(
                name=name_field(c.get("name"), f"{cat}.name"),
                value=int_field(c.get("value"), f"{cat}.value", minimum=0, maximum=MAX_CLASS_VALUE),
                preemptible=c.get("preemptible", True),
                needs_approval=c.get("needsApproval", False),
            )
        )
    names = [c.name for c in classes]
    if len(set(names)) != len(names):
        raise InvalidSpec(at, f"class names must be unique: {names}")
    return tuple(classes)


_GPU_TYPE_KEYS = ("name", "family", "memoryGiB", "speed", "form")
_FORMS = ("", "SXM", "PCIE", "NVL")
MAX_GPU_TYPES = 64


def parse_gpu_types(value: Any, at: str = "gpuTypes") -> tuple[GpuModel, ...]:
    """The admin's GPU types: `[{name, family, memoryGiB, speed, form}]`, added to the built-in ones
    (a built-in name redefines that type). `family` defaults to the name (a type of one variant)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidSpec(at, "must be a list of {name, family, memoryGiB, speed}")
    if len(value) > MAX_GPU_TYPES:
        raise InvalidSpec(at, f"must have at most {MAX_GPU_TYPES} entries, got {len(value)}")
    models: list[GpuModel] = []
    seen: set[str] = set()
    builtin_families = {m.family for m in BUILTIN_TYPES} - {m.name for m in BUILTIN_TYPES}
    for i, raw in enumerate(value):
        tat = f"{at}[{i}]"
        entry = _mapping(raw, tat)
        _unknown_keys(entry, _GPU_TYPE_KEYS, tat)
        name = _gpu_name(entry.get("name"), f"{tat}.name")
        if name in seen:
            raise InvalidSpec(f"{tat}.name", f"duplicate GPU type {name!r}")
        if name in builtin_families:
            raise InvalidSpec(f"{tat}.name", f"{name!r} is a family of built-in variants; name a variant")
        seen.add(name)
        family = _gpu_name(entry.get("family", name), f"{tat}.family")
        form = entry.get("form", "")
        if form not in _FORMS:
            raise InvalidSpec(f"{tat}.form", f"must be one of SXM, PCIE, NVL or empty, got {form!r}")
        models.append(
            GpuModel(
                name=GpuType(name),
                family=GpuType(family),
                memory_gib=int_field(entry.get("memoryGiB"), f"{tat}.memoryGiB", minimum=1, maximum=4096),
                speed=number_field(
                    entry.get("speed", 1.0), f"{tat}.speed", minimum=0.001, maximum=MAX_GPU_SPEED
                ),
                form=str(form),
            )
        )
    names = {m.name for m in models} | {m.name for m in BUILTIN_TYPES}
    for i, model in enumerate(models):
        if model.family != model.name and model.family in names:
            raise InvalidSpec(f"{at}[{i}].family", f"{model.family!r} is a GPU type, not a family")
    return tuple(models)


def _gpu_name(value: Any, at: str) -> str:
    if (
        not isinstance(value, str)
        or not value
        or len(value) > 32
        or not value.replace("-", "").replace(".", "").replace("_", "").isalnum()
        or not value.isascii()
    ):
        raise InvalidSpec(
            at, f"must be a GPU type name like 'H100-SXM' (letters, digits, '-', '.', '_'), got {value!r}"
        )
    return value


def parse_settings(doc: Mapping[str, Any]) -> SchedulingSettings:
    """The settings parts of a federation config: every key is optional."""
    speeds = _mapping(doc.get("gpuSpeeds"), "gpuSpeeds")
    egress = []
    for i, e in enumerate(doc.get("egress") or []):
        eat = f"egress[{i}]"
        e = _mapping(e, eat)
        _unknown_keys(e, ("from", "to", "usdPerGb"), eat)
        egress.append(
            EgressRate(
                source_store=name_field(e.get("from"), f"{eat}.from"),
                destination_store=name_field(e.get("to"), f"{eat}.to"),
                usd_per_gb=number_field(e.get("usdPerGb"), f"{eat}.usdPerGb", minimum=0, maximum=MAX_USD),
            )
        )
    datasets = []
    for i, d in enumerate(doc.get("datasets") or []):
        dat = f"datasets[{i}]"
        d = _mapping(d, dat)
        _unknown_keys(d, ("name", "store", "sizeGiB"), dat)
        name = d.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidSpec(f"{dat}.name", "must be a dataset reference such as imagenet@2012")
        datasets.append(
            DatasetLocation(
                dataset=name,
                store=name_field(d.get("store"), f"{dat}.store"),
                size_bytes=int(
                    number_field(d.get("sizeGiB", 0), f"{dat}.sizeGiB", minimum=0, maximum=MAX_DATASET_GIB)
                    * 2**30
                ),
            )
        )
    policy_doc = _mapping(doc.get("policy"), "policy")
    extra = ("preemptionIntervalSeconds", "usageHalfLifeHours", "maxQueuedJobs", "maxQueuedJobsPerTenant")
    _unknown_keys(policy_doc, [*_POLICY_KEYS, *extra], "policy")
    defaults = PolicyConfig()
    kinds = {f.name: type(getattr(defaults, f.name)) for f in fields(PolicyConfig)}
    changes: dict[str, Any] = {}
    for key, attr in _POLICY_KEYS.items():
        if key not in policy_doc:
            continue
        value = policy_doc[key]
        if kinds[attr] is bool:
            if not isinstance(value, bool):
                raise InvalidSpec(f"policy.{key}", f"must be true or false, got {value!r}")
            changes[attr] = value
        elif attr == "preemption_limit_gpus":
            changes[attr] = _optional_count(value, f"policy.{key}")
        elif kinds[attr] is int:
            changes[attr] = int_field(value, f"policy.{key}", minimum=1, maximum=int(_policy_maximum(key)))
        else:
            changes[attr] = number_field(value, f"policy.{key}", minimum=0, maximum=_policy_maximum(key))
    return SchedulingSettings(
        priority_classes=parse_priority_classes(doc.get("priorityClasses")),
        gpu_speeds=tuple(
            sorted(
                (GpuType(str(g)), number_field(v, f"gpuSpeeds.{g}", minimum=0.001, maximum=MAX_GPU_SPEED))
                for g, v in speeds.items()
            )
        ),
        egress_rates=tuple(egress),
        datasets=tuple(datasets),
        policy=replace(defaults, **changes),
        preemption_interval_s=number_field(
            policy_doc.get("preemptionIntervalSeconds", 600),
            "policy.preemptionIntervalSeconds",
            minimum=1,
            maximum=MAX_SECONDS,
        ),
        usage_half_life_h=number_field(
            policy_doc.get("usageHalfLifeHours", 24),
            "policy.usageHalfLifeHours",
            minimum=0.01,
            maximum=MAX_HOURS,
        ),
        gpu_types=parse_gpu_types(doc.get("gpuTypes")),
        max_queued_jobs=_policy_queue_limit(policy_doc, "maxQueuedJobs", DEFAULT_MAX_QUEUED_JOBS),
        max_queued_jobs_per_tenant=_policy_queue_limit(
            policy_doc, "maxQueuedJobsPerTenant", DEFAULT_MAX_QUEUED_JOBS_PER_TENANT
        ),
    )


def tenant_document(t: TenantRecord) -> dict[str, Any]:
    """The tenant in the config file's keys: what `parse_tenant` reads back to the same record."""
    doc: dict[str, Any] = {"name": t.name}
    if t.parent is not None:
        doc["parent"] = t.parent
    if t.gpu_caps:
        doc["gpuCaps"] = dict(t.gpu_caps)
    if t.quotas:
        quotas: dict[str, dict[str, int]] = {}
        for q in t.quotas:
            entry = {"guaranteed": q.guaranteed_gpus}
            for key, value in (
                ("borrowingLimit", q.borrowing_limit_gpus),
                ("lendingLimit", q.lending_limit_gpus),
                ("cap", q.cap_gpus),
            ):
                if value is not None:
                    entry[key] = value
            quotas[q.gpu_type] = entry
        doc["quotas"] = quotas
    doc["weight"] = t.weight
    if t.monthly_budget_gpu_hours is not None:
        doc["monthlyBudgetGpuHours"] = t.monthly_budget_gpu_hours
    if t.max_priority_class is not None:
        doc["maxPriorityClass"] = t.max_priority_class
    if t.submit_rate_per_s is not None:
        doc["submitRateLimit"] = {"perSecond": t.submit_rate_per_s, "burst": t.submit_burst}
    if t.max_queued_jobs is not None:
        doc["maxQueuedJobs"] = t.max_queued_jobs
    if t.pod_security is not PodSecurityLevel.BASELINE:
        doc["podSecurity"] = t.pod_security.value
    # Always written: an admin reading a tenant sees which wait its jobs get, default or not.
    doc["costPolicy"] = t.cost_policy.value
    return doc
