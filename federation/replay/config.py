"""Every assumption of a replay, read from one YAML file.

Nothing the replay decides is hidden in code: the private clusters and their internal rates, the
public clusters and where their prices come from, how GPU types are assigned to trace jobs, the
teams' quotas, the run-time limit given to jobs, the control plane's cycle and the policies compared
all come from here, so a result can be reproduced from the file and the command alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from federation.replay.errors import ReplayError
from placement.model import GpuType, GpuTypePolicy
from placement.model_policy import CostPolicy

_HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class GpuChoice:
    """One entry of the mix: jobs drawn here accept these types (in order, or any by cost)."""

    gpu_types: tuple[GpuType, ...]
    share: float
    policy: GpuTypePolicy = GpuTypePolicy.ORDERED


@dataclass(frozen=True, slots=True)
class PrivateCluster:
    name: str
    region: str
    # Fraction of the private GPUs of a run that this cluster holds, per type.
    type_fractions: tuple[tuple[GpuType, float], ...]
    usd_per_gpu_hour: tuple[tuple[GpuType, float], ...]


@dataclass(frozen=True, slots=True)
class PublicCluster:
    """A cloud region; its price per GPU type is read from the price file (cheapest instance per GPU)."""

    name: str
    cloud: str
    region: str
    # Our GPU type -> the price file's accelerator name.
    accelerators: tuple[tuple[GpuType, str], ...]


@dataclass(frozen=True, slots=True)
class GpufedSettings:
    """The PolicyConfig knobs of gpufed's own policy (the Starburst-style wait)."""

    private_wait_s_per_gpu_hour: float
    private_wait_max_s: float
    wait_value_usd_per_hour: float = 0.0
    # Wait only when running gangs' run-time limits free private room before the wait ends.
    private_wait_needs_start: bool = False
    # Reserve that room for the first waiting gang of a cycle.
    private_wait_reserve: bool = False
    # How many waiting gangs of a cycle may hold such reservations (never overlapping).
    private_wait_reservations: int = 1
    # The job's size: fewer GPUs never wait; more than `..._max_gpus` wait without the room test.
    private_wait_min_gpus: int = 1
    private_wait_needs_start_max_gpus: int | None = None
    # The job's length: gangs of more work than this many hours wait without the room test.
    private_wait_needs_start_max_run_h: float | None = None
    # Gangs that have waited this long on the room test's word wait on without it (dear gangs only).
    private_wait_needs_start_after_s: float | None = None
    # Repatriation: move running cloud gangs back to idle private GPUs when that saves money.
    repatriate: bool = False
    repatriate_min_saving_usd: float = 0.0
    move_overhead_s: float = 900.0
    # Spot: jobs may run on spot capacity (a reclaim restarts them from scratch), those whose expected
    # slowdown by such restarts is at most `spot_max_restart_slowdown` (None: any job).
    spot: bool = False
    spot_max_restart_slowdown: float | None = None
    # Idle private GPUs before any cloud offer, spot included, whatever the internal rate.
    prefer_private: bool = False
    # A wait for private GPUs is priced against the cloud's whole bill (the internal rate is paid
    # whether they run or not), so jobs whose spot offer is priced under that rate wait too.
    private_rate_sunk: bool = False
    # Every team's cost policy (`placement.wait_policy`): `saver` doubles the wait and tests room only
    # for jobs of at most 24 h of work; `fast` never waits.
    cost_policy: CostPolicy = CostPolicy.BALANCED


@dataclass(frozen=True, slots=True)
class DeadlineSettings:
    """Which trace jobs get a deadline, and how tight: Philly records none, so the replay draws them.

    A job gets one with probability `share`, at submission + a factor drawn uniformly from
    [`min_factor`, `max_factor`] times its trace duration (V100 time), but at least `min_slack_s`
    after the duration, from a generator seeded by (`seed`, job id): the same jobs get the same
    deadlines in a sample as in the full week."""

    share: float = 0.0
    min_factor: float = 2.0
    max_factor: float = 4.0
    seed: int = 0
    # The least time a deadline leaves beyond the job's run: a deadline inside the cloud's lead time
    # can be met only by private GPUs that happen to be free at that instant.
    min_slack_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ResumableSettings:
    """Which trace jobs checkpoint (`resumable: true` in their manifests): Philly records nothing of
    it, so the replay draws them. A job is resumable with probability `share`, from a generator seeded
    by (`seed`, job id), so a sample of the week has the same resumable jobs as the full week.

    A spot reclaim of a resumable job loses the work since its last checkpoint, taken as the placer's
    `spot_lost_work_h` (or the time since its start, if less), under every policy: checkpointing is
    the job's doing, not the scheduler's. Which placers are told is the policies' matter
    (`PolicySpec.sees_resumable`)."""

    share: float = 0.0
    seed: int = 0


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    trace_path: Path
    prices_path: Path
    seed: int
    gpu_mix: tuple[GpuChoice, ...]
    gpu_speeds: tuple[tuple[GpuType, float], ...]
    gpus_per_node: int
    private_clusters: tuple[PrivateCluster, ...]
    # Private GPUs as multiples of the week's mean GPU demand (GPU-hours / week hours).
    private_sizes: tuple[float, ...]
    public_clusters: tuple[PublicCluster, ...]
    lead_time_s: float
    cloud_max_gpus_per_type: int
    allow_spot: bool
    spot_restart_risk_per_hour: float
    # Prices that mark a row as a placeholder, not a price (both on demand and spot equal to one).
    placeholder_prices_usd_per_hour: tuple[float, ...]
    # Each team's guarantee per type: this fraction of the private GPUs of the type, split by demand share.
    guarantee_fraction: float
    preemption: bool
    grace_period_s: float
    runtime_limit_factor: float
    # "limit": the placer's cost model sees only the run-time limit; "exact": it knows the duration.
    expected_runtime: str
    cycle_s: float
    period_s: float
    fixed_waits_s: tuple[float, ...]
    gpufed: GpufedSettings
    # Extra gpufed settings to sweep (its own cost/JCT curve); may be empty.
    gpufed_sweep: tuple[GpufedSettings, ...] = ()
    # A second yardstick: burst-now and the fixed waits again, with gpufed's spot rule (its bound on
    # restarts and idle private GPUs first), so that what spot alone buys is not read as the wait's.
    spot_curve: bool = False
    # Of the jobs that checkpoint (`resumable`), those whose run-time limit is at least this many hours
    # may be moved back to private GPUs (0: any length).
    movable_min_runtime_h: float = 0.0
    # Deadlines drawn for a share of the jobs (none by default); gpufed's placer sees them, the
    # yardsticks (burst-now, the fixed waits) do not, and every policy's misses are counted.
    deadlines: DeadlineSettings = DeadlineSettings()
    # Resumable jobs drawn for a share of the trace (none by default): a spot reclaim restarts them from
    # their last checkpoint; gpufed's placer is told which they are.
    resumable: ResumableSettings = ResumableSettings()
    # Whether the spot-aware yardstick's placer is told too (`policies.spot_curve_resumable`, on unless
    # a config says false): told, that yardstick is gpufed's spot rule with a fixed wait, so a ratio
    # against it measures what the wait adds; off, it keeps resumable jobs off spot by the restart
    # bound as if each reclaim restarted them from scratch, which flatters gpufed.
    spot_curve_resumable: bool = True
    # Whether the fixed-wait curves hold every job for their wait (`policies.fixed_wait_every_job`),
    # the ones whose cloud offer is priced under the internal rate (spot) too: "wait W, then burst".
    # Off: such jobs burst at once, as the cost model's saving (cloud less internal rate) is none.
    fixed_wait_every_job: bool = False
    # Only the first N jobs (0: all); every Nth job (1: all). For quick runs and tests.
    limit_jobs: int = 0
    every_nth_job: int = 1
    # Only the policies of these names (empty: all), for tuning runs.
    only_policies: tuple[str, ...] = ()
    source: Path | None = field(default=None, compare=False)

    def speed(self, gpu_type: GpuType) -> float:
        return dict(self.gpu_speeds).get(gpu_type, 1.0)


def _need(doc: dict[str, Any], key: str, where: str) -> Any:
    if key not in doc:
        raise ReplayError(f"{where}: missing field {key!r}")
    return doc[key]


def _path(value: str, base: Path) -> Path:
    path = Path(value)
    return path if path.is_absolute() else (base / path).resolve()


def _gpufed(doc: dict[str, Any], where: str) -> GpufedSettings:
    return GpufedSettings(
        private_wait_s_per_gpu_hour=float(_need(doc, "private_wait_s_per_gpu_hour", where)),
        private_wait_max_s=float(doc.get("private_wait_max_s", 4 * _HOUR_S)),
        wait_value_usd_per_hour=float(doc.get("wait_value_usd_per_hour", 0.0)),
        private_wait_needs_start=bool(doc.get("private_wait_needs_start", False)),
        private_wait_reserve=bool(doc.get("private_wait_reserve", False)),
        private_wait_reservations=int(doc.get("private_wait_reservations", 1)),
        private_wait_min_gpus=int(doc.get("private_wait_min_gpus", 1)),
        private_wait_needs_start_max_gpus=(
            None
            if doc.get("private_wait_needs_start_max_gpus") is None
            else int(doc["private_wait_needs_start_max_gpus"])
        ),
        private_wait_needs_start_max_run_h=(
            None
            if doc.get("private_wait_needs_start_max_run_h") is None
            else float(doc["private_wait_needs_start_max_run_h"])
        ),
        private_wait_needs_start_after_s=(
            None
            if doc.get("private_wait_needs_start_after_s") is None
            else float(doc["private_wait_needs_start_after_s"])
        ),
        repatriate=bool(doc.get("repatriate", False)),
        repatriate_min_saving_usd=float(doc.get("repatriate_min_saving_usd", 0.0)),
        move_overhead_s=float(doc.get("move_overhead_s", 900.0)),
        spot=bool(doc.get("spot", False)),
        spot_max_restart_slowdown=(
            None if doc.get("spot_max_restart_slowdown") is None else float(doc["spot_max_restart_slowdown"])
        ),
        prefer_private=bool(doc.get("prefer_private", False)),
        private_rate_sunk=bool(doc.get("private_rate_sunk", False)),
        cost_policy=_cost_policy(doc.get("cost_policy", CostPolicy.BALANCED.value), where),
    )


def _cost_policy(value: Any, where: str) -> CostPolicy:
    try:
        return CostPolicy(value)
    except ValueError:
        raise ReplayError(
            f"{where}.cost_policy: {value!r} is not one of {[p.value for p in CostPolicy]}"
        ) from None


def _deadlines(doc: Any) -> DeadlineSettings:
    if doc is None:
        return DeadlineSettings()
    if not isinstance(doc, dict):
        raise ReplayError(
            "jobs.deadlines: expected a mapping (share, min_factor, max_factor, seed, min_slack_s)"
        )
    settings = DeadlineSettings(
        share=float(doc.get("share", 0.0)),
        min_factor=float(doc.get("min_factor", 2.0)),
        max_factor=float(doc.get("max_factor", 4.0)),
        seed=int(doc.get("seed", 0)),
        min_slack_s=float(doc.get("min_slack_s", 0.0)),
    )
    if settings.min_slack_s < 0:
        raise ReplayError(f"jobs.deadlines.min_slack_s: must be >= 0 (got {settings.min_slack_s:g})")
    if not 0.0 <= settings.share <= 1.0:
        raise ReplayError(f"jobs.deadlines.share: must be between 0 and 1 (got {settings.share:g})")
    if not 1.0 <= settings.min_factor <= settings.max_factor:
        raise ReplayError(
            "jobs.deadlines: need 1 <= min_factor <= max_factor (a deadline before the job's own run "
            f"time cannot be met; got {settings.min_factor:g} and {settings.max_factor:g})"
        )
    return settings


def _resumable(doc: Any) -> ResumableSettings:
    if doc is None:
        return ResumableSettings()
    if not isinstance(doc, dict):
        raise ReplayError("jobs.resumable: expected a mapping (share, seed)")
    unknown = sorted(set(doc) - {"share", "seed"})
    if unknown:
        raise ReplayError(f"jobs.resumable: unknown keys {unknown} (expected share, seed)")
    settings = ResumableSettings(share=float(doc.get("share", 0.0)), seed=int(doc.get("seed", 0)))
    if not 0.0 <= settings.share <= 1.0:
        raise ReplayError(f"jobs.resumable.share: must be between 0 and 1 (got {settings.share:g})")
    return settings


def parse_config(doc: dict[str, Any], base: Path, source: Path | None = None) -> ReplayConfig:
    """A config from its YAML document; relative paths are taken from `base`."""
    if not isinstance(doc, dict):
        raise ReplayError("config: expected a mapping at the top level")
    mix = tuple(
        GpuChoice(
            gpu_types=tuple(GpuType(t) for t in _need(entry, "types", "gpu_mix[]")),
            share=float(_need(entry, "share", "gpu_mix[]")),
            policy=GpuTypePolicy(entry.get("policy", "ordered")),
        )
        for entry in _need(doc, "gpu_mix", "config")
    )
    if not mix or abs(sum(c.share for c in mix) - 1.0) > 1e-6:
        raise ReplayError("gpu_mix: shares must sum to 1")
    private = _need(doc, "private", "config")
    clusters = tuple(
        PrivateCluster(
            name=str(_need(c, "name", "private.clusters[]")),
            region=str(c.get("region", "dc")),
            type_fractions=tuple(
                (GpuType(t), float(f)) for t, f in _need(c, "type_fractions", "private.clusters[]").items()
            ),
            usd_per_gpu_hour=tuple(
                (GpuType(t), float(p)) for t, p in _need(c, "usd_per_gpu_hour", "private.clusters[]").items()
            ),
        )
        for c in _need(private, "clusters", "private")
    )
    total = sum(f for c in clusters for _, f in c.type_fractions)
    if abs(total - 1.0) > 1e-6:
        raise ReplayError(f"private.clusters: type_fractions must sum to 1 over all clusters (got {total:g})")
    public = _need(doc, "public", "config")
    clouds = tuple(
        PublicCluster(
            name=str(_need(c, "name", "public.clusters[]")),
            cloud=str(_need(c, "cloud", "public.clusters[]")),
            region=str(_need(c, "region", "public.clusters[]")),
            accelerators=tuple(
                (GpuType(t), str(a)) for t, a in _need(c, "accelerators", "public.clusters[]").items()
            ),
        )
        for c in public.get("clusters", [])
    )
    jobs = doc.get("jobs", {})
    quotas = doc.get("quotas", {})
    placer = doc.get("placer", {})
    policies = doc.get("policies", {})
    expected = str(jobs.get("expected_runtime", "limit"))
    if expected not in ("limit", "exact"):
        raise ReplayError("jobs.expected_runtime: must be 'limit' or 'exact'")
    gpufed = _gpufed(_need(policies, "gpufed", "policies"), "policies.gpufed")
    if policies.get("spot_curve") and not gpufed.spot:
        raise ReplayError("policies.spot_curve: needs gpufed's spot rule (policies.gpufed.spot: true)")
    return ReplayConfig(
        trace_path=_path(str(_need(doc, "trace", "config")), base),
        prices_path=_path(str(_need(doc, "prices", "config")), base),
        seed=int(doc.get("seed", 0)),
        gpu_mix=mix,
        gpu_speeds=tuple((GpuType(t), float(s)) for t, s in doc.get("gpu_speeds", {}).items()),
        gpus_per_node=int(private.get("gpus_per_node", 8)),
        private_clusters=clusters,
        private_sizes=tuple(float(s) for s in private.get("sizes", [1.0])),
        public_clusters=clouds,
        lead_time_s=float(public.get("lead_time_s", 0.0)),
        cloud_max_gpus_per_type=int(public.get("max_gpus_per_type", 4096)),
        allow_spot=bool(public.get("spot", False)),
        spot_restart_risk_per_hour=float(public.get("spot_restart_risk_per_hour", 0.05)),
        placeholder_prices_usd_per_hour=tuple(float(p) for p in doc.get("placeholder_prices", [700.0])),
        guarantee_fraction=float(quotas.get("guarantee_fraction", 1.0)),
        preemption=bool(quotas.get("preemption", True)),
        grace_period_s=float(quotas.get("grace_period_s", 30.0)),
        runtime_limit_factor=float(jobs.get("runtime_limit_factor", 1.5)),
        expected_runtime=expected,
        cycle_s=float(placer.get("cycle_s", 30.0)),
        period_s=float(doc.get("period_s", 7 * 24 * _HOUR_S)),
        fixed_waits_s=tuple(float(w) for w in policies.get("fixed_waits_s", [])),
        gpufed=gpufed,
        gpufed_sweep=tuple(_gpufed(g, "policies.gpufed_sweep[]") for g in policies.get("gpufed_sweep", [])),
        spot_curve=bool(policies.get("spot_curve", False)),
        movable_min_runtime_h=float(jobs.get("movable_min_runtime_h", 0.0)),
        deadlines=_deadlines(jobs.get("deadlines")),
        resumable=_resumable(jobs.get("resumable")),
        spot_curve_resumable=bool(policies.get("spot_curve_resumable", True)),
        fixed_wait_every_job=bool(policies.get("fixed_wait_every_job", False)),
        limit_jobs=int(doc.get("limit_jobs", 0)),
        every_nth_job=int(doc.get("every_nth_job", 1)),
        source=source,
    )


def load_config(path: Path) -> ReplayConfig:
    """Read a replay config; relative trace and price paths are taken from the file's directory."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ReplayError(f"{path}: cannot read the config: {error}") from error
    try:
        return parse_config(doc, path.parent.resolve(), source=path)
    except (TypeError, ValueError, AttributeError) as error:
        raise ReplayError(f"{path}: {error}") from error
