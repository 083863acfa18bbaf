"""Prometheus metrics: queue depth per tenant, admissions, cycle time, API latency.

Each server owns its own registry so that several servers in one test process do not collide. The
server's HTTP port serves it at `/metrics` (`federation.console.app`), beside the web console.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.api_latency = Histogram(
            "gpufed_api_request_seconds",
            "gRPC call latency by method and status code",
            ["method", "code"],
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.jobs_submitted = Counter(
            "gpufed_jobs_submitted_total", "Jobs accepted by SubmitJob", ["tenant"], registry=r
        )
        # Bound children of the two metrics every submission touches (`observe_call`, `job_submitted`).
        self._latency_children: dict[tuple[str, str], Histogram] = {}
        self._submitted_children: dict[str, Counter] = {}
        self.submissions_refused = Counter(
            "gpufed_submissions_refused_total",
            "Submissions refused before anything was stored: reason queue_full (maxQueuedJobs) or "
            "rate_limited (submitRateLimit)",
            ["tenant", "reason"],
            registry=r,
        )
        self.queue_depth = Gauge("gpufed_queue_depth", "Jobs waiting in the queue", ["tenant"], registry=r)
        self.admissions = Counter(
            "gpufed_admissions_total", "Gangs admitted to a cluster", ["cluster", "gpu_type"], registry=r
        )
        self.admission_conflicts = Counter(
            "gpufed_admission_conflicts_total",
            "Admissions undone because a compare-and-swap lost",
            registry=r,
        )
        self.preemptions = Counter(
            "gpufed_preemptions_total",
            "Running gangs evicted so that another job fits",
            ["tenant"],
            registry=r,
        )
        self.moves = Counter(
            "gpufed_moves_total",
            "Running cloud gangs ordered to stop at a checkpoint and resume on idle private GPUs",
            ["tenant"],
            registry=r,
        )
        self.cycle_seconds = Histogram(
            "gpufed_scheduling_cycle_seconds",
            "Time of one scheduling cycle",
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        # Every cycle begun, idle ones (skipped: nothing they read changed) included; `job_admitted`
        # log lines carry the number of their cycle, so a wait can be counted in cycles.
        self.cycles_started = Counter(
            "gpufed_scheduling_cycles_started_total",
            "Scheduling cycles begun, including those skipped as idle",
            registry=r,
        )
        # The worker thread's CPU for the snapshot and the plan: what a cycle costs the machine, apart
        # from the time it waits for the GIL, for etcd, or steps aside for calls.
        self.cycle_cpu_seconds = Counter(
            "gpufed_scheduling_cycle_cpu_seconds",
            "CPU time of the scheduling cycles' snapshots and plans",
            registry=r,
        )
        self.transitions = Counter(
            "gpufed_job_transitions_total", "Phase changes written", ["to_phase"], registry=r
        )
        self.is_leader = Gauge("gpufed_leader", "1 while this server holds the leader lease", registry=r)
        self.leader_crashes = Counter(
            "gpufed_leader_term_crashes_total",
            "Leader terms ended by an unexpected error (the server gave the key back)",
            registry=r,
        )
        # The archiver (federation.scheduling.archiver): what it moved to the history store, what
        # is left for it, and what its last pass cost.
        self.archived = Counter(
            "gpufed_archived_total",
            "Records moved from etcd to the history store, by kind (jobs, audit, tails), and expired kept "
            "tails deleted from it (tails_pruned)",
            ["kind"],
            registry=r,
        )
        self.archive_backlog = Gauge(
            "gpufed_archive_backlog_jobs",
            "Ended jobs past history.retainInEtcd still in etcd, as the archiver's last look saw them",
            registry=r,
        )
        self.archive_pass_seconds = Gauge(
            "gpufed_archive_last_pass_seconds", "Duration of the archiver's last pass", registry=r
        )
        self._known_tenants: set[str] = set()
        # gRPC calls being served now (on the event loop). Background work on other threads reads it
        # to step aside while a call waits (`federation.scheduling.yielding`).
        self.calls_in_flight = 0
        in_flight = Gauge("gpufed_api_calls_in_flight", "gRPC calls being served", registry=r)
        in_flight.set_function(lambda: self.calls_in_flight)

    def observe_call(self, method: str, code: str, seconds: float) -> None:
        # Each (method, code)'s child kept: `labels()` takes a lock and checks its labels at every
        # call, every API call pays it, and the children are never removed.
        child = self._latency_children.get((method, code))
        if child is None:
            child = self._latency_children[(method, code)] = self.api_latency.labels(method=method, code=code)
        child.observe(seconds)

    def job_submitted(self, tenant: str) -> None:
        """One more job accepted for `tenant` (`gpufed_jobs_submitted_total`)."""
        child = self._submitted_children.get(tenant)
        if child is None:
            child = self._submitted_children[tenant] = self.jobs_submitted.labels(tenant=tenant)
        child.inc()

    def set_queue_depth(self, by_tenant: Mapping[str, int]) -> None:
        # Tenants whose queue emptied must read 0, not keep their last value.
        for tenant in self._known_tenants - by_tenant.keys():
            self.queue_depth.labels(tenant=tenant).set(0)
        for tenant, depth in by_tenant.items():
            self.queue_depth.labels(tenant=tenant).set(depth)
        self._known_tenants |= set(by_tenant)
