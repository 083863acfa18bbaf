"""The simulated scheduler: binds pending pods to nodes, whole gangs or nothing, best fit first.

It keeps its own account of what each node has left (allocatable minus the requests of bound pods
that have not finished), updated from store changes, so a scheduling pass never lists pods.

Pods are placed in units: the pods sharing a Volcano PodGroup (`scheduling.k8s.io/group-name`)
are bound only when at least `minMember` of them fit at once, and any other pod on its own, the
way kube-scheduler places them: a `batch/v1` Job without a PodGroup starts its pods one by one,
as far as capacity goes, whoever created it. Units that
did not fit are tried again only when capacity may have appeared (a pod finished, a node changed),
so a queue of thousands of unschedulable pods costs nothing while nothing changes.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

from clusters.sim import podstatus
from clusters.sim.capacity import GPU, Demand, NodeInfo, tolerates
from clusters.sim.clock import Clock
from clusters.sim.events import EventRecorder
from clusters.sim.resources import NODES, POD_GROUPS, PODS
from clusters.sim.selectors import node_selector_terms_match
from clusters.sim.store import Change, EventType, Key, Store, edit, key_of

Obj = dict[str, Any]
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
# ("group", ns, podgroup) | ("pod", ns, name)
UnitKey = tuple[str, str, str]


class Scheduler:
    def __init__(self, store: Store, clock: Clock, recorder: EventRecorder) -> None:
        self._store = store
        self._clock = clock
        self._recorder = recorder
        self._nodes: dict[str, NodeInfo] = {}
        # Node names by free GPUs, so that best fit looks at the tightest nodes first.
        self._by_free: dict[int, set[str]] = {}
        self._bound: dict[Key, tuple[str, Demand, UnitKey]] = {}
        self._group_bound: Counter[UnitKey] = Counter()
        # Pending pods by unit, in arrival order, and the units not yet tried since the last change.
        self._units: dict[UnitKey, dict[Key, int]] = {}
        self._unit_of: dict[Key, UnitKey] = {}
        self._fresh: set[UnitKey] = set()
        self._retry_all = False
        self._seq = itertools.count()
        self._reported: dict[Key, str] = {}
        self._max_free_gpu = 0
        self._demands: dict[str, Demand] = {}
        # Per unit: its place in the queue (priority, arrival) and the GPUs of its largest pod.
        self._unit_meta: dict[UnitKey, tuple[tuple[int, int], int]] = {}
        # Units that did not fit when last tried.
        self._refused: set[UnitKey] = set()

    # -- observing ----------------------------------------------------------------------------

    def observe(self, change: Change) -> None:
        if change.rt is PODS:
            self._observe_pod(change)
        elif change.rt is NODES:
            name = change.obj["metadata"]["name"]
            previous = self._nodes.pop(name, None)
            if previous is not None:
                self._unbucket(previous)
            if change.type is not EventType.DELETED:
                info = NodeInfo.of(change.obj)
                if previous is not None:
                    info.used = previous.used
                self._nodes[name] = info
                self._bucket(info)
            self._retry_all = True
        elif change.rt is POD_GROUPS and change.type is not EventType.DELETED:
            self._retry_all = True

    def _observe_pod(self, change: Change) -> None:
        pod = change.obj
        key = key_of(pod)
        node = podstatus.node_name(pod)
        live = change.type is not EventType.DELETED and not podstatus.is_terminal(pod)
        if node and live:
            if key not in self._bound:
                self._account(key, node, Demand.of(pod), _unit_key(pod))
        elif key in self._bound:
            self._release(key)
        pending = live and not node and not podstatus.is_deleting(pod)
        if pending and key not in self._unit_of:
            unit = _unit_key(pod)
            self._unit_of[key] = unit
            self._units.setdefault(unit, {})[key] = next(self._seq)
            priority = -int((pod.get("spec") or {}).get("priority") or 0)
            order, largest = self._unit_meta.get(unit, ((priority, next(self._seq)), 0))
            self._unit_meta[unit] = (order, max(largest, self._demand(pod).gpu))
            self._fresh.add(unit)
        elif not pending and key in self._unit_of:
            unit = self._unit_of.pop(key)
            members = self._units.get(unit)
            if members is not None:
                members.pop(key, None)
                if not members:
                    del self._units[unit]
                    del self._unit_meta[unit]
                    self._refused.discard(unit)
            self._reported.pop(key, None)
            self._demands.pop(pod["metadata"]["uid"], None)

    def _account(self, key: Key, node: str, demand: Demand, unit: UnitKey) -> None:
        self._bound[key] = (node, demand, unit)
        self._group_bound[unit] += 1
        info = self._nodes.get(node)
        if info is not None:
            self._unbucket(info)
            info.used[0] += demand.gpu
            info.used[1] += demand.cpu_m
            info.used[2] += demand.memory_b
            info.used[3] += 1
            self._bucket(info)

    def _release(self, key: Key) -> None:
        node, demand, unit = self._bound.pop(key)
        self._group_bound[unit] -= 1
        if self._group_bound[unit] <= 0:
            del self._group_bound[unit]
        info = self._nodes.get(node)
        if info is not None:
            self._unbucket(info)
            info.used[0] -= demand.gpu
            info.used[1] -= demand.cpu_m
            info.used[2] -= demand.memory_b
            info.used[3] -= 1
            self._bucket(info)
        self._retry_all = True

    def _bucket(self, info: NodeInfo) -> None:
        self._by_free.setdefault(info.gpu - info.used[0], set()).add(info.name)

    def _unbucket(self, info: NodeInfo) -> None:
        free = info.gpu - info.used[0]
        bucket = self._by_free.get(free)
        if bucket is not None:
            bucket.discard(info.name)
            if not bucket:
                del self._by_free[free]

    def free_gpus(self) -> dict[str, int]:
        """Free GPUs per node as the scheduler sees them, for tests and the admin endpoint."""
        return {n.name: n.gpu - n.used[0] for n in self._nodes.values()}

    # -- scheduling ---------------------------------------------------------------------------

    def sync(self) -> bool:
        units = list(self._units) if self._retry_all else [u for u in self._fresh if u in self._units]
        self._retry_all = False
        self._fresh.clear()
        if not units:
            return False
        units.sort(key=lambda u: self._unit_meta[u][0])
        self._refresh_max_free()
        for unit in units:
            members = self._units.get(unit)
            if not members:
                continue
            # A unit refused before whose largest pod fits on no node is skipped without scanning
            # the nodes: that keeps a backlog of thousands of pending pods cheap while capacity
            # frees up a little at a time.
            if unit in self._refused and self._unit_meta[unit][1] > self._max_free_gpu:
                continue
            self._schedule_unit(unit, [self._store.require(PODS, *k) for k in members])
        return True

    def _refresh_max_free(self) -> None:
        self._max_free_gpu = max(
            (n.gpu - n.used[0] for n in self._nodes.values() if n.ready and not n.unschedulable), default=0
        )

    def _demand(self, pod: Obj) -> Demand:
        """Requests parsed once per pod: quantity parsing dominated scheduling passes otherwise."""
        uid = pod["metadata"]["uid"]
        demand = self._demands.get(uid)
        if demand is None:
            demand = self._demands[uid] = Demand.of(pod)
        return demand

    def _schedule_unit(self, unit: UnitKey, pods: list[Obj]) -> None:
        kind, namespace, name = unit
        if kind == "group":
            group = self._store.get(POD_GROUPS, namespace, name)
            if group is None:
                self._refused.add(unit)
                self._unschedulable(pods, f'podgroup "{namespace}/{name}" not found')
                return
            min_member = int((group.get("spec") or {}).get("minMember") or 1)
            need = max(0, min_member - self._group_bound.get(unit, 0))
        else:
            need = 1
        placed, reasons = self._place(pods, need)
        if len(placed) < need or not placed:
            message = _summary(len(self._nodes), reasons)
            if kind != "pod":
                message = f"{len(pods)} pending pods of the gang, {need} must start together: {message}"
            self._refused.add(unit)
            self._unschedulable(pods, message)
            return
        bound = {key_of(p) for p, _ in placed}
        for pod, node in placed:
            self._bind(pod, node)
        self._refused.discard(unit)
        self._refresh_max_free()
        if len(bound) < len(pods):
            message = _summary(len(self._nodes), reasons)
            self._unschedulable([p for p in pods if key_of(p) not in bound], message)

    def _place(self, pods: list[Obj], need: int) -> tuple[list[tuple[Obj, str]], Counter[str]]:
        """Best fit for each pod in turn, largest first, against tentative usage."""
        extra: dict[str, list[int]] = {}
        placed: list[tuple[Obj, str]] = []
        reasons: Counter[str] = Counter()
        ordered = sorted(pods, key=lambda p: -self._demand(p).gpu)
        for i, pod in enumerate(ordered):
            demand = self._demand(pod)
            pod_reasons: Counter[str] = Counter()
            node = self._best_node(pod, demand, extra, pod_reasons)
            if node is None:
                # Report why the first pod that did not fit was refused, per node, as kube-scheduler does.
                if not reasons:
                    reasons.update(pod_reasons)
                if need == len(pods) or len(placed) + (len(ordered) - i - 1) < need:
                    break
                continue
            placed.append((pod, node))
            add = extra.setdefault(node, [0, 0, 0, 0])
            add[0] += demand.gpu
            add[1] += demand.cpu_m
            add[2] += demand.memory_b
            add[3] += 1
        return placed, reasons

    def _best_node(
        self, pod: Obj, demand: Demand, extra: dict[str, list[int]], reasons: Counter[str]
    ) -> str | None:
        spec = pod.get("spec") or {}
        selector: dict[str, str] = spec.get("nodeSelector") or {}
        tolerations: list[Obj] = spec.get("tolerations") or []
        terms = (
            ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
                "requiredDuringSchedulingIgnoredDuringExecution"
            )
            or {}
        ).get("nodeSelectorTerms") or []
        best: tuple[int, int, str] | None = None
        # Nodes already holding some of this gang's tentative pods sit in stale buckets: judge them
        # one by one, then walk the buckets from the tightest fit up and stop at the first that fits.
        for name, add in extra.items():
            info = self._nodes[name]
            if self._unfit(info, demand, selector, tolerations, terms, add) is None:
                score = (
                    info.gpu - info.used[0] - add[0] - demand.gpu,
                    info.cpu_m - info.used[1] - add[1],
                    name,
                )
                best = score if best is None else min(best, score)
        for free in sorted(self._by_free):
            if free < demand.gpu:
                continue
            if best is not None and free - demand.gpu > best[0]:
                break
            for name in self._by_free[free]:
                if name in extra:
                    continue
                info = self._nodes[name]
                if self._unfit(info, demand, selector, tolerations, terms, None) is None:
                    score = (free - demand.gpu, info.cpu_m - info.used[1], name)
                    best = score if best is None else min(best, score)
        if best is None:
            # Nothing fits: look at every node once, to say why, as kube-scheduler's message does.
            for info in self._nodes.values():
                why = self._unfit(info, demand, selector, tolerations, terms, extra.get(info.name))
                if why is not None:
                    reasons[why] += 1
        return None if best is None else best[2]

    @staticmethod
    def _unfit(
        info: NodeInfo,
        demand: Demand,
        selector: dict[str, str],
        tolerations: list[Obj],
        terms: list[Obj],
        extra: list[int] | None,
    ) -> str | None:
        add = extra or (0, 0, 0, 0)
        # Capacity first: on a busy cluster it is what rules out most nodes, and it is the cheapest.
        if demand.gpu and info.gpu - info.used[0] - add[0] < demand.gpu:
            return f"Insufficient {GPU}"
        if not info.ready:
            return "node(s) were not ready"
        if info.unschedulable:
            return "node(s) were unschedulable"
        for taint in info.taints:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
                return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
        if any(info.labels.get(k) != v for k, v in selector.items()) or not node_selector_terms_match(
            terms, info.labels
        ):
            return "node(s) didn't match Pod's node affinity/selector"
        if demand.cpu_m and info.cpu_m - info.used[1] - add[1] < demand.cpu_m:
            return "Insufficient cpu"
        if demand.memory_b and info.memory_b - info.used[2] - add[2] < demand.memory_b:
            return "Insufficient memory"
        if info.pods - info.used[3] - add[3] < 1:
            return "Too many pods"
        return None

    def _bind(self, pod: Obj, node: str) -> None:
        wall_s = self._clock.wall_s()
        bound = edit(pod, "status")
        bound["spec"] = {**pod["spec"], "nodeName": node}
        podstatus.set_condition(bound, "PodScheduled", "True", wall_s)
        bound = self._store.update(PODS, bound)
        m = bound["metadata"]
        self._recorder.record(
            PODS,
            bound,
            "Scheduled",
            f"Successfully assigned {m.get('namespace')}/{m['name']} to {node}",
            component="default-scheduler",
        )

    def _unschedulable(self, pods: list[Obj], message: str) -> None:
        wall_s = self._clock.wall_s()
        for pod in pods:
            key = key_of(pod)
            if self._reported.get(key) == message:
                continue
            self._reported[key] = message
            marked = edit(pod, "status")
            podstatus.set_condition(marked, "PodScheduled", "False", wall_s, "Unschedulable", message)
            marked = self._store.update(PODS, marked)
            self._recorder.record(
                PODS, marked, "FailedScheduling", message, warning=True, component="default-scheduler"
            )


def _unit_key(pod: Obj) -> UnitKey:
    m = pod["metadata"]
    namespace = m.get("namespace", "")
    group = (m.get("annotations") or {}).get(GROUP_ANNOTATION)
    if group:
        return ("group", namespace, group)
    return ("pod", namespace, m["name"])


def _summary(node_count: int, reasons: Counter[str]) -> str:
    detail = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
    return f"0/{node_count} nodes are available: {detail or 'no nodes'}."
