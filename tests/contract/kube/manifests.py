"""Small manifests for the conformance cases, written as a user would write them."""

from __future__ import annotations

import json
from typing import Any

# Runs about `seconds` on a real cluster (busybox prints a line a second) and on the simulator
# (which reads the duration annotation and ignores the command).
SLEEPER_IMAGE = "busybox:1.36"
# The simulator's run time for a pod, in seconds as a bare number ("4", never "4s"): it ignores a
# value it cannot read as a number and runs the pod for the cluster's default instead, which made
# every pod here run for `defaultDurationS` whatever `seconds` said.
SIM_DURATION_ANNOTATION = "sim.gpufed.io/duration"


def sim_duration(seconds: float) -> dict[str, str]:
    return {SIM_DURATION_ANNOTATION: f"{seconds:g}"}


def pod(
    name: str,
    *,
    gpus: int | str | None = None,
    gpu_type: str | None = None,
    seconds: int = 600,
    node_name: str | None = None,
    labels: dict[str, str] | None = None,
    restart_policy: str = "Never",
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if gpus is not None:
        resources = {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}
    spec: dict[str, Any] = {
        "restartPolicy": restart_policy,
        "containers": [
            {
                "name": "main",
                "image": SLEEPER_IMAGE,
                "command": ["sh", "-c", f"for i in $(seq {seconds}); do echo line $i; sleep 1; done"],
                "resources": resources,
            }
        ],
    }
    if gpu_type is not None:
        spec["nodeSelector"] = {"nvidia.com/gpu.product": gpu_type}
    if node_name is not None:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": labels or {"app": name},
            "annotations": sim_duration(seconds),
        },
        "spec": spec,
    }


def job(
    name: str, *, parallelism: int, gpus: int, seconds: int = 600, suspend: bool = False
) -> dict[str, Any]:
    template = pod(name, gpus=gpus, seconds=seconds, restart_policy="Never")
    template["metadata"].pop("name")
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "suspend": suspend,
            "backoffLimit": 0,
            "template": {"metadata": template["metadata"], "spec": template["spec"]},
        },
    }


def service(name: str, ports: list[int]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "selector": {"app": name},
            "ports": [{"name": f"p{p}", "port": p, "targetPort": p, "protocol": "TCP"} for p in ports],
        },
    }


def configmap(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def dump(doc: dict[str, Any]) -> str:
    """JSON, which kubectl reads as YAML; numbers stay numbers (`nvidia.com/gpu: 4`), as users write."""
    return json.dumps(doc)
