"""`PulumiProvisioner`: node pools through Pulumi's Automation API, one stack per (cluster, pool).

Each pool is its own stack, named `<cluster>.<pool>` (`stack_name`), in project `gpufed-pools`, so
one pool's failure or lock never blocks another. State lives in a local file backend under the state
directory by default (`file://<state_dir>/pulumi`), or in a bucket (`s3://...`, `gs://...`,
`azblob://...`) named by `backend_url`; it is written both to the project settings and to
`PULUMI_BACKEND_URL`. Secrets are encrypted with a passphrase (`PULUMI_CONFIG_PASSPHRASE`), which
never appears in a repr or a log.

One operation per stack at a time: an asyncio lock per stack here, and Pulumi's own lock across
processes (its "concurrent update" is `StackBusy`, retryable). Every call has a timeout; a call
that overruns raises `OperationTimedOut`, and its stack stays locked until the CLI really ends, so
no second operation can start beside it. Errors are mapped to retryable or permanent by what the
CLI said (`classify`).

The Pulumi CLI cannot be installed on the machines this project is built on: tests inject a
`PulumiCommand` that records the CLI calls and answers them (`tests/unit/test_iac_automation.py`);
a test with the real CLI runs where `pulumi` is on PATH.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import structlog
from pulumi import automation as auto

from iac.api import (
    ChangePreview,
    ChangeResult,
    Operation,
    PendingOperation,
    PoolStatus,
    check_not_below_busy,
    usd_per_hour,
)
from iac.errors import (
    CapacityUnavailable,
    IacError,
    InvalidConfig,
    NetworkError,
    OperationTimedOut,
    PermissionDenied,
    QuotaExceeded,
    StackBusy,
    Throttled,
)
from iac.pools import Cloud, PoolSpec, validate
from iac.programs import pool_program

log = structlog.get_logger("gpufed.iac")

PROJECT = "gpufed-pools"
T = TypeVar("T")

# What the CLI says, first match wins: permanent conditions before the retryable ones, so that
# "quota exceeded (retry later)" is read as the quota it is.
_RULES: tuple[tuple[re.Pattern[str], type[IacError]], ...] = (
    (re.compile(r"quota|limitexceeded|limit exceeded|vcpulimit", re.I), QuotaExceeded),
    (
        re.compile(
            r"unauthori[sz]ed|accessdenied|access denied|forbidden|\b403\b|permission|"
            r"no valid credential|could not find default credentials|authorizationfailed",
            re.I,
        ),
        PermissionDenied,
    ),
    (
        re.compile(
            r"insufficientinstancecapacity|zone_resource_pool_exhausted|stockout|"
            r"skunotavailable|allocationfailed|overconstrainedallocation",
            re.I,
        ),
        CapacityUnavailable,
    ),
    (
        re.compile(r"conflict: another update|currently locked by|concurrent update", re.I),
        StackBusy,
    ),
    (
        re.compile(r"throttl|rate exceeded|rate limit|too many requests|\b429\b|requestlimitexceeded", re.I),
        Throttled,
    ),
    (re.compile(r"timed? ?out|deadline exceeded", re.I), OperationTimedOut),
    (
        re.compile(
            r"connection reset|connection refused|no such host|temporar|unavailable|\b50[234]\b|"
            r"\beof\b|i/o timeout|network is unreachable|tls handshake",
            re.I,
        ),
        NetworkError,
    ),
)


def stack_name(spec: PoolSpec) -> str:
    """`<cluster>.<pool>`: Pulumi stack names allow letters, digits, '-', '_' and '.'."""
    return spec.pool_id


def classify(error: Exception) -> IacError:
    """The project error for what Pulumi raised, with the CLI's own words (the end of them)."""
    if isinstance(error, IacError):
        return error
    text = str(error)
    if isinstance(error, auto.CommandError):
        text = f"{getattr(error, 'stderr', '')}\n{getattr(error, 'stdout', '')}\n{error}"
    message = text.strip()[-2000:]
    if isinstance(error, auto.ConcurrentUpdateError):
        return StackBusy(f"another operation holds the stack: {message}")
    for pattern, kind in _RULES:
        if pattern.search(text):
            return kind(message)
    # Unknown failures are not retried blindly: a person reads them first.
    return InvalidConfig(message)


def region_config(spec: PoolSpec) -> dict[str, auto.ConfigValue]:
    """The provider's stack config: where the pool's resources are made."""
    if spec.cloud is Cloud.AWS:
        return {"aws:region": auto.ConfigValue(spec.region)}
    if spec.cloud is Cloud.GCP:
        return {
            "gcp:project": auto.ConfigValue(spec.setting("project")),
            "gcp:region": auto.ConfigValue(spec.region),
        }
    return {"azure-native:location": auto.ConfigValue(spec.region)}


# Where each program's resource keeps its node count, in the stack's exported state.
_COUNT_PATH: dict[Cloud, tuple[str, tuple[str, ...]]] = {
    Cloud.AWS: ("aws:eks/nodeGroup:NodeGroup", ("scalingConfig", "desiredSize")),
    Cloud.GCP: ("gcp:container/nodePool:NodePool", ("nodeCount",)),
    Cloud.AZURE: ("azure-native:containerservice:AgentPool", ("count",)),
}


def nodes_in_state(spec: PoolSpec, deployment: Mapping[str, Any] | None) -> int | None:
    """The pool's node count as its last refresh saw it (None: the stack holds no such pool)."""
    kind, path = _COUNT_PATH[spec.cloud]
    for resource in (deployment or {}).get("resources") or []:
        if resource.get("type") != kind:
            continue
        value: Any = resource.get("outputs") or {}
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return int(value) if isinstance(value, int | float) else 0
    return None


class PulumiProvisioner:
    def __init__(
        self,
        *,
        state_dir: Path,
        passphrase: str,
        backend_url: str | None = None,
        command: auto.PulumiCommand | None = None,
        timeout_s: float = 1800.0,
        # The usual time a scale-up takes, for the pending operation's expected end only.
        lead_time_s: float = 600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._state_dir = state_dir
        self._backend_url = backend_url or f"file://{state_dir / 'pulumi'}"
        self._passphrase = passphrase
        self._command = command
        self._timeout_s = timeout_s
        self._lead_time_s = lead_time_s
        self._clock = clock
        self._locks: dict[str, asyncio.Lock] = {}
        self._nodes: dict[str, int] = {}
        self._pending: dict[str, PendingOperation] = {}

    def __repr__(self) -> str:
        # Never the passphrase.
        return f"PulumiProvisioner(backend={self._backend_url!r})"

    @property
    def backend_url(self) -> str:
        return self._backend_url

    def _stack(self, spec: PoolSpec, nodes: int) -> auto.Stack:
        if self._backend_url.startswith("file://"):
            Path(self._backend_url.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
        work_dir = self._state_dir / "work" / stack_name(spec)
        work_dir.mkdir(parents=True, exist_ok=True)
        sized = validate(spec.with_nodes(nodes))
        options = auto.LocalWorkspaceOptions(
            work_dir=str(work_dir),
            pulumi_command=self._command,
            secrets_provider="passphrase",
            project_settings=auto.ProjectSettings(
                name=PROJECT, runtime="python", backend=auto.ProjectBackend(url=self._backend_url)
            ),
            env_vars={
                "PULUMI_BACKEND_URL": self._backend_url,
                "PULUMI_CONFIG_PASSPHRASE": self._passphrase,
                "PULUMI_SKIP_UPDATE_CHECK": "true",
            },
        )

        def program() -> None:
            pool_program(sized)

        stack = auto.create_or_select_stack(
            stack_name(spec), project_name=PROJECT, program=program, opts=options
        )
        stack.set_all_config(region_config(spec))
        return stack

    async def _locked(self, spec: PoolSpec, op: Operation, nodes_to: int, work: Callable[[], T]) -> T:
        name = stack_name(spec)
        lock = self._locks.setdefault(name, asyncio.Lock())
        await lock.acquire()
        started = time.monotonic()
        before = self._nodes.get(spec.pool_id, 0)
        now = self._clock()
        # A scale-up is expected to take the lead time; other operations have no estimate.
        expected = now + self._lead_time_s if op is Operation.SCALE_UP else None
        self._pending[name] = PendingOperation(spec.pool_id, op, before, nodes_to, now, expected)
        task = asyncio.ensure_future(asyncio.to_thread(work))
        released = False

        def release(_: object = None) -> None:
            self._pending.pop(name, None)
            lock.release()

        try:
            done, _ = await asyncio.wait({task}, timeout=self._timeout_s)
            if not done:
                # The CLI cannot be interrupted from here; the stack stays locked until it ends.
                task.add_done_callback(release)
                released = True
                log.warning("pool_operation_timed_out", op=op.value, stack=name, timeout_s=self._timeout_s)
                raise OperationTimedOut(f"{op} of {name} did not finish in {self._timeout_s:g}s")
            try:
                result = task.result()
            except Exception as error:
                mapped = classify(error)
                log.warning(
                    "pool_operation_failed",
                    op=op.value,
                    stack=name,
                    error=type(mapped).__name__,
                    retryable=mapped.retryable,
                )
                raise mapped from error
        finally:
            if not released:
                release()
        log.info("pool_operation_done", op=op.value, stack=name, took_s=round(time.monotonic() - started, 1))
        return result

    def _current_nodes(self, stack: auto.Stack, spec: PoolSpec) -> int:
        outputs = stack.outputs()
        return int(outputs["nodes"].value) if "nodes" in outputs else 0

    async def preview(self, spec: PoolSpec, nodes: int) -> ChangePreview:
        spec = validate(spec)

        def work() -> tuple[int, dict[str, int]]:
            stack = self._stack(spec, nodes)
            before = self._current_nodes(stack, spec)
            summary = stack.preview().change_summary
            return before, {str(getattr(op, "value", op)): int(n) for op, n in summary.items()}

        before, steps = await self._locked(spec, Operation.PREVIEW, nodes, work)
        self._nodes[spec.pool_id] = before
        return ChangePreview(
            pool_id=spec.pool_id,
            nodes_before=before,
            nodes_after=nodes,
            usd_per_hour_before=usd_per_hour(spec, before),
            usd_per_hour_after=usd_per_hour(spec, nodes),
            steps=tuple(sorted(steps.items())),
        )

    async def apply(self, spec: PoolSpec, nodes: int, *, busy_nodes: int = 0) -> ChangeResult:
        spec = validate(spec)
        check_not_below_busy(spec, nodes, busy_nodes)
        op = Operation.SCALE_UP if nodes >= self._nodes.get(spec.pool_id, 0) else Operation.SCALE_DOWN

        def work() -> int:
            stack = self._stack(spec, nodes)
            before = self._current_nodes(stack, spec)
            stack.up()
            return before

        before = await self._locked(spec, op, nodes, work)
        self._nodes[spec.pool_id] = nodes
        # `up` returns once the cloud reports the pool at its new size: the nodes are ready now.
        return ChangeResult(
            spec.pool_id, before, nodes, self._clock(), usd_per_hour(spec, before), usd_per_hour(spec, nodes)
        )

    async def destroy(self, spec: PoolSpec, *, busy_nodes: int = 0) -> ChangeResult:
        spec = validate(spec)
        check_not_below_busy(spec, 0, busy_nodes)

        def work() -> int:
            stack = self._stack(spec, 0)
            before = self._current_nodes(stack, spec)
            stack.destroy()
            return before

        before = await self._locked(spec, Operation.DESTROY, 0, work)
        self._nodes.pop(spec.pool_id, None)
        return ChangeResult(spec.pool_id, before, 0, self._clock(), usd_per_hour(spec, before), 0.0)

    async def refresh(self, spec: PoolSpec) -> PoolStatus:
        spec = validate(spec)

        def work() -> int | None:
            stack = self._stack(spec, self._nodes.get(spec.pool_id, spec.desired_nodes))
            stack.refresh()
            return nodes_in_state(spec, stack.export_stack().deployment)

        found = await self._locked(spec, Operation.REFRESH, self._nodes.get(spec.pool_id, 0), work)
        nodes = found or 0
        if found is None:
            self._nodes.pop(spec.pool_id, None)
        else:
            self._nodes[spec.pool_id] = nodes
        return PoolStatus(spec.pool_id, found is not None, nodes, nodes, usd_per_hour(spec, nodes))

    async def status(self, spec: PoolSpec) -> PoolStatus:
        nodes = self._nodes.get(spec.pool_id, 0)
        pending = self._pending.get(stack_name(spec))
        return PoolStatus(
            spec.pool_id,
            spec.pool_id in self._nodes,
            nodes,
            nodes,
            usd_per_hour(spec, nodes),
            (pending,) if pending else (),
        )
