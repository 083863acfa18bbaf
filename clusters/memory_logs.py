"""What the in-memory cluster shows of a gang for `gpufed describe` and `gpufed logs`: a fake.

The in-memory cluster models no pods, so each replica is shown as one made-up pod on the node it was
placed on, and its log is two lines (started, and how it ended) made from the gang's record, stamped
when asked as a kubelet stamps them. That is
enough for the federation's logs service to be tested without a simulated API server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from clusters.api import GangPhase, LogOptions, ReplicaState
from clusters.logtext import format_stamp

_POD_PHASE = {
    GangPhase.PENDING: "Pending",
    GangPhase.RUNNING: "Running",
    GangPhase.SUCCEEDED: "Succeeded",
    GangPhase.FAILED: "Failed",
    GangPhase.EVICTED: "Failed",
    GangPhase.CANCELLED: "Failed",
}


def fake_replicas(
    gang: str,
    phase: GangPhase,
    message: str,
    placements: Sequence[tuple[str, int, str]],
    started_at_s: float,
    finished_at_s: float | None,
) -> list[ReplicaState]:
    """One pod per (task, replica index, node) placement."""
    reason = {GangPhase.FAILED: "Error", GangPhase.EVICTED: "Evicted"}.get(phase, "")
    return [
        ReplicaState(
            pod=f"{gang}-{task}-{index}",
            task=task,
            index=index,
            by_rank=False,
            node=node,
            phase=_POD_PHASE[phase],
            restarts=0,
            exit_code=None if finished_at_s is None else (0 if phase is GangPhase.SUCCEEDED else 1),
            reason=reason,
            message=message if reason else "",
            started_at_s=started_at_s,
            finished_at_s=finished_at_s,
            container=task,
        )
        for task, index, node in placements
    ]


async def fake_log(replica: ReplicaState, options: LogOptions) -> AsyncIterator[bytes]:
    started_s = replica.started_at_s or 0.0
    lines = [(started_s, f"[memory] {replica.task}-{replica.index} started on {replica.node}")]
    if replica.finished_at_s is not None:
        lines.append(
            (
                replica.finished_at_s,
                f"[memory] {replica.task}-{replica.index} ended: {replica.phase} {replica.message}".rstrip(),
            )
        )
    if options.tail_lines is not None:
        lines = lines[-options.tail_lines :] if options.tail_lines else []
    # Stamped as the pod log API stamps lines with `timestamps`: readers resume and cut by them.
    data = "".join(
        f"{format_stamp(at_s)} {text}\n" if options.timestamps else f"{text}\n" for at_s, text in lines
    ).encode()
    if options.limit_bytes is not None:
        data = data[: options.limit_bytes]
    if data:
        yield data
