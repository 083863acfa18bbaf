"""What a node offers and what a pod asks for, in the integer units the scheduler adds up.

Kept apart from the scheduler so that the accounting (allocatable minus the requests of bound,
unfinished pods) reads on its own, and so that the fault and admin code can share it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clusters.sim import podstatus, quantity

Obj = dict[str, Any]
GPU = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class Demand:
    gpu: int = 0
    cpu_m: int = 0
    memory_b: int = 0

    @classmethod
    def of(cls, pod: Obj) -> Demand:
        gpu = cpu = mem = 0
        for c in podstatus.containers(pod):
            requests = (c.get("resources") or {}).get("requests") or {}
            gpu += quantity.whole(requests.get(GPU, 0))
            cpu += quantity.milli(requests.get("cpu", 0))
            mem += quantity.whole(requests.get("memory", 0))
        return cls(gpu, cpu, mem)


@dataclass(slots=True)
class NodeInfo:
    name: str
    labels: dict[str, str]
    taints: list[Obj]
    ready: bool
    unschedulable: bool
    gpu: int
    cpu_m: int
    memory_b: int
    pods: int
    used: list[int] = field(default_factory=lambda: [0, 0, 0, 0])

    @classmethod
    def of(cls, node: Obj) -> NodeInfo:
        alloc = (node.get("status") or {}).get("allocatable") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (node.get("status") or {}).get("conditions") or []
        )
        return cls(
            name=node["metadata"]["name"],
            labels=dict(node["metadata"].get("labels") or {}),
            taints=list((node.get("spec") or {}).get("taints") or []),
            ready=ready,
            unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
            gpu=quantity.whole(alloc.get(GPU, 0)),
            cpu_m=quantity.milli(alloc.get("cpu", 0)),
            memory_b=quantity.whole(alloc.get("memory", 0)),
            pods=quantity.whole(alloc.get("pods", 110)),
        )


def tolerates(tolerations: list[Obj], taint: Obj) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t.get("key") == taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False
