"""A gpufed server's own figures, read from its Prometheus endpoint (`/metrics`) by the benchmarks.

One reader for every benchmark that asks the leader about its scheduling cycles: how many it
planned, their seconds and their CPU (snapshot and plan, on their worker thread).
"""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

CYCLES_STARTED = "gpufed_scheduling_cycles_started_total"
CYCLES_PLANNED = "gpufed_scheduling_cycle_seconds_count"
CYCLES_SECONDS = "gpufed_scheduling_cycle_seconds_sum"
CYCLES_CPU_S = "gpufed_scheduling_cycle_cpu_seconds_total"


def samples(port: int, timeout_s: float = 10.0) -> dict[str, float]:
    """Every sample the server at `port` exposes, by its name (the first, where labels make several)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as reply:
        text = reply.read().decode()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, sample.value)
    return found


def cycles(port: int, timeout_s: float = 10.0) -> tuple[float, float, float]:
    """The leader's scheduling cycles so far: (planned, their seconds, their CPU seconds); 0 for a
    series not exposed yet."""
    found = samples(port, timeout_s)
    return found.get(CYCLES_PLANNED, 0.0), found.get(CYCLES_SECONDS, 0.0), found.get(CYCLES_CPU_S, 0.0)
