"""Simulated Kubernetes clusters that serve the Kubernetes REST API over real HTTP on loopback.

The official `kubernetes` client and kubectl work against them unchanged; see docs/kubernetes.md
("Starting a simulated cluster") for the in-process API, the process entry and the fault endpoint.
"""

from __future__ import annotations

from clusters.sim.clock import Clock, ManualClock, ScaledClock
from clusters.sim.cluster import SimCluster
from clusters.sim.config import SimClusterConfig, SimConfigError, SimPoolConfig, cluster, load
from clusters.sim.faults import Faults, Unreachable
from clusters.sim.threaded import ThreadedSim

__all__ = [
    "Clock",
    "Faults",
    "ManualClock",
    "ScaledClock",
    "SimCluster",
    "SimClusterConfig",
    "SimConfigError",
    "SimPoolConfig",
    "ThreadedSim",
    "Unreachable",
    "cluster",
    "load",
]
