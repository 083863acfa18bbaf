"""The pods of a Volcano Job as its controller writes them: names, labels, annotations, owner.

Kept apart from the controller's state machine. Each pod is `<job>-<task>-<index>` (the same name
again after a restart), labelled and annotated the way Volcano does (`volcano.sh/job-name`,
`volcano.sh/task-spec`, the PodGroup annotation, `volcano.sh/job-version`), which is what gpufed's
backend and the Volcano controller itself read back.
"""

from __future__ import annotations

from typing import Any

from clusters.sim.resources import VOLCANO_JOBS
from clusters.sim.scheduler import GROUP_ANNOTATION
from clusters.sim.store import clone

Obj = dict[str, Any]
JOB_NAME = "volcano.sh/job-name"
VERSION = "volcano.sh/job-version"


def owner_vcjob(pod: Obj) -> str | None:
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "Job" and ref.get("apiVersion") == VOLCANO_JOBS.api_version:
            return str(ref.get("name"))
    return None


def owner_ref(job: Obj) -> Obj:
    m = job["metadata"]
    return {
        "apiVersion": VOLCANO_JOBS.api_version,
        "kind": "Job",
        "name": m["name"],
        "uid": m["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def version_of(pod: Obj) -> int:
    text = (pod["metadata"].get("annotations") or {}).get(VERSION, "0")
    return int(text) if str(text).isdigit() else 0


def pod_for(job: Obj, task: Obj, index: int, name: str) -> Obj:
    m = job["metadata"]
    spec = job["spec"]
    template = clone(task.get("template") or {})
    tm = template.get("metadata") or {}
    pod_spec = template.get("spec") or {}
    version = str((job.get("status") or {}).get("version", 0))
    labels = dict(tm.get("labels") or {})
    labels.update(
        {
            JOB_NAME: m["name"],
            "volcano.sh/job-namespace": m["namespace"],
            "volcano.sh/queue-name": spec.get("queue", "default"),
            "volcano.sh/task-spec": task["name"],
            "volcano.sh/task-index": str(index),
        }
    )
    annotations = dict(tm.get("annotations") or {})
    annotations.update(
        {
            GROUP_ANNOTATION: m["name"],
            JOB_NAME: m["name"],
            "volcano.sh/task-spec": task["name"],
            "volcano.sh/job-version": version,
            "volcano.sh/queue-name": spec.get("queue", "default"),
            "volcano.sh/task-index": str(index),
        }
    )
    pod_spec.setdefault("schedulerName", spec.get("schedulerName", "volcano"))
    if spec.get("priorityClassName"):
        pod_spec.setdefault("priorityClassName", spec["priorityClassName"])
    plugins = spec.get("plugins") or {}
    if "svc" in plugins:
        pod_spec["hostname"] = name
        pod_spec["subdomain"] = m["name"]
    if "env" in plugins:
        for c in pod_spec.get("containers") or []:
            env = c.setdefault("env", [])
            env += [
                {"name": "VC_TASK_INDEX", "value": str(index)},
                {"name": "VK_TASK_INDEX", "value": str(index)},
            ]
    return {
        "metadata": {
            "name": name,
            "namespace": m["namespace"],
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_ref(job)],
        },
        "spec": pod_spec,
    }
