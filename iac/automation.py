"""`PulumiProvisioner`: node pools through Pulumi's Automation API, one stack per (cluster, pool).

Each pool is its own stack (`<cluster>.<pool>`) in project `gpufed-pools`, so one pool's failure or
lock never blocks another. State lives in a local file backend under the state directory by default,
or in a bucket (`s3://...`, `gs://...`, `azblob://...`) named by `backend_url`; secrets are encrypted
with a passphrase. One operation per stack at a time (an asyncio lock here; Pulumi's own lock across
processes, whose "concurrent update" is retryable). Every call has a timeout. Errors are mapped to
retryable or permanent by what the CLI said.

The Pulumi CLI cannot be installed on the machines this project is built on: tests inject a
`PulumiCommand` that records the CLI calls and answers them (`tests/unit/test_iac_automation.py`);
a test with the real CLI runs where `pulumi` is on PATH.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import structlog
from pulumi import automation as auto

from iac.api import ChangePreview, ChangeResult, PermanentIacError, RetryableIacError, usd_per_hour
from iac.pools import Cloud, PoolSpec, validate
from iac.programs import pool_program

log = structlog.get_logger("gpufed.iac")

PROJECT = "gpufed-pools"
T = TypeVar("T")

# What the CLI says when trying again may work, and when it will not.
_RETRYABLE = re.compile(
    r"(conflict: another update|currently being updated|throttl|rate exceeded|too many requests|429|"
    r"timed? ?out|timeout|connection reset|connection refused|temporar|unavailable|503|502|eof)",
    re.I,
)
_PERMANENT = re.compile(
    r"(quota|limitexceeded|unauthori[sz]ed|accessdenied|access denied|forbidden|403|permission|"
    r"invalidparameter|invalid value|not found|does not exist|validation)",
    re.I,
)


def stack_name(spec: PoolSpec) -> str:
    return f"{spec.cluster}.{spec.name}"


def classify(error: Exception) -> Exception:
    """The project error for what Pulumi raised: retryable or permanent, with the CLI's own words."""
    if isinstance(error, auto.ConcurrentUpdateError):
        return RetryableIacError(f"another operation holds the stack: {error}")
    text = str(error)
    if isinstance(error, auto.CommandError):
        text = f"{getattr(error, 'stderr', '')} {getattr(error, 'stdout', '')} {error}"
    if _PERMANENT.search(text):
        return PermanentIacError(text.strip()[-2000:])
    if _RETRYABLE.search(text):
        return RetryableIacError(text.strip()[-2000:])
    return PermanentIacError(text.strip()[-2000:])


def region_config(spec: PoolSpec) -> dict[str, auto.ConfigValue]:
    if spec.cloud is Cloud.AWS:
        return {"aws:region": auto.ConfigValue(spec.region)}
    if spec.cloud is Cloud.GCP:
        return {
            "gcp:project": auto.ConfigValue(spec.setting("project")),
            "gcp:region": auto.ConfigValue(spec.region),
        }
    return {"azure-native:location": auto.ConfigValue(spec.region)}


class PulumiProvisioner:
    def __init__(
        self,
        *,
        state_dir: Path,
        passphrase: str,
        backend_url: str | None = None,
        command: auto.PulumiCommand | None = None,
        timeout_s: float = 1800.0,
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

    def __repr__(self) -> str:
        # Never the passphrase.
        return f"PulumiProvisioner(backend={self._backend_url!r})"

    def _stack(self, spec: PoolSpec, nodes: int) -> auto.Stack:
        if self._backend_url.startswith("file://"):
            Path(self._backend_url.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
        sized = _with_nodes(spec, nodes)
        options = auto.LocalWorkspaceOptions(
            pulumi_command=self._command,
            project_settings=auto.ProjectSettings(
                name=PROJECT, runtime="python", backend=auto.ProjectBackend(url=self._backend_url)
            ),
            env_vars={"PULUMI_CONFIG_PASSPHRASE": self._passphrase, "PULUMI_SKIP_UPDATE_CHECK": "true"},
        )

        def program() -> None:
            pool_program(sized)

        stack = auto.create_or_select_stack(
            stack_name(spec), project_name=PROJECT, program=program, opts=options
        )
        stack.set_all_config(region_config(spec))
        return stack

    async def _locked(self, spec: PoolSpec, what: str, work: Callable[[], T]) -> T:
        lock = self._locks.setdefault(stack_name(spec), asyncio.Lock())
        async with lock:
            started = time.monotonic()
            try:
                result = await asyncio.wait_for(asyncio.to_thread(work), timeout=self._timeout_s)
            except TimeoutError:
                raise RetryableIacError(
                    f"{what} of {stack_name(spec)} did not finish in {self._timeout_s:g}s"
                ) from None
            except (auto.CommandError, auto.ConcurrentUpdateError, RuntimeError) as error:
                mapped = classify(error)
                log.warning(
                    "pool_operation_failed",
                    op=what,
                    stack=stack_name(spec),
                    retryable=mapped.__class__.__name__,
                )
                raise mapped from error
            log.info(
                "pool_operation_done",
                op=what,
                stack=stack_name(spec),
                took_s=round(time.monotonic() - started, 1),
            )
            return result

    async def preview(self, spec: PoolSpec, nodes: int) -> ChangePreview:
        spec = validate(spec)
        before = self._nodes.get(spec.pool_id, 0)

        def work() -> dict[str, int]:
            summary = self._stack(spec, nodes).preview().change_summary
            return {str(getattr(op, "value", op)): int(n) for op, n in summary.items()}

        steps = await self._locked(spec, "preview", work)
        return ChangePreview(
            pool_id=spec.pool_id,
            nodes_before=before,
            nodes_after=nodes,
            usd_per_hour_before=usd_per_hour(spec, before),
            usd_per_hour_after=usd_per_hour(spec, nodes),
            steps=tuple(sorted((str(k), int(v)) for k, v in steps.items())),
        )

    async def apply(self, spec: PoolSpec, nodes: int) -> ChangeResult:
        spec = validate(spec)
        await self._locked(spec, "up", lambda: self._stack(spec, nodes).up())
        self._nodes[spec.pool_id] = nodes
        return ChangeResult(spec.pool_id, nodes, self._clock() + self._lead_time_s)

    async def destroy(self, spec: PoolSpec) -> None:
        spec = validate(spec)
        await self._locked(spec, "destroy", lambda: self._stack(spec, 0).destroy())
        self._nodes.pop(spec.pool_id, None)

    async def refresh(self, spec: PoolSpec) -> int:
        spec = validate(spec)

        def work() -> int:
            stack = self._stack(spec, self._nodes.get(spec.pool_id, spec.desired_nodes))
            stack.refresh()
            outputs = stack.outputs()
            return int(outputs["nodes"].value) if "nodes" in outputs else 0

        nodes = await self._locked(spec, "refresh", work)
        self._nodes[spec.pool_id] = nodes
        return nodes


def _with_nodes(spec: PoolSpec, nodes: int) -> PoolSpec:
    # A scale beyond the pool's bounds widens them: asking for 6 nodes of a 0..4 pool means 0..6.
    return replace(
        spec, desired_nodes=nodes, max_nodes=max(spec.max_nodes, nodes), min_nodes=min(spec.min_nodes, nodes)
    )
