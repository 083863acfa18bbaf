"""What one `gpufed serve` process does: the API, the leader's loops, or both (`--role`).

The leader's scheduling cycle plans over every queued job on a worker thread of the process that
also serves the API, and however short the cycle gets, its CPU and the GIL are taken from the
calls on the event loop beside it: with 20,000 of one tenant's jobs queued, another tenant's
ListJobs p99 was 1.4 to 2 times its figure alone (issue 30, item 15; bench/listjobs_queue.py).
Production schedulers keep the two apart for that reason (kube-scheduler beside kube-apiserver,
Armada's scheduler beside its server), and so may gpufed:

* `all` (the default, and what every server did before roles): serves the API and the console,
  and stands for leader; the leader runs the scheduling cycle, the reconcilers, the archiver, the
  compactor, and every server runs the job sets' and the outputs' controllers.
* `api`: serves the gRPC API, the console, `/metrics` and `/readyz`, and never stands for leader nor
  runs a background loop that acts on jobs. Its readiness does not wait for a leader: reads work
  without one, and submissions are stored and wait, as they do between leaders.
* `scheduler`: the same process as `all`. The name says where it sits in a split deployment: the
  chart's Services send clients to the `api` servers only, so the leader's cores and GIL are the
  loops'; an operator can still reach its API directly (port-forward) when no `api` server is up.
"""

from __future__ import annotations

from enum import StrEnum


class ServerRole(StrEnum):
    ALL = "all"
    API = "api"
    SCHEDULER = "scheduler"

    @property
    def stands_for_leader(self) -> bool:
        """Whether the process takes part in the leader election (and so may run the loops)."""
        return self is not ServerRole.API

    @property
    def runs_controllers(self) -> bool:
        """Whether the process runs the job sets' and the outputs' controllers, which every server
        of role `all` runs (their writes are compare-and-swap or idempotent, so two never do one
        thing twice); an `api` server leaves them to the scheduler's servers."""
        return self is not ServerRole.API
