"""The rendezvous environment and hostfile each pod of a gang gets, on Volcano and as an Indexed Job.

Each pod's variables are resolved the way a kubelet would (values, the index annotation through a
`fieldRef`, and the rank prelude run by a real `/bin/sh`), so that the cases check what a process
in the pod would read, against PyTorch's definitions: WORLD_SIZE counts processes, RANK is the global
rank of the pod's first process, NODE_RANK the pod's place in the gang.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest

from clusters.api import GangWorkload, ReplicaSpec
from clusters.kubernetes import manifests, rendezvous
from clusters.kubernetes.manifests import NodeSelection
from placement.model import CapacityKind, GpuType, JobId, TenantId

SELECTION = NodeSelection(node_selector=(("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),))
NAME = "llm-1-a1"


def a_gang(*tasks: tuple[str, int, int], command: tuple[str, ...] = ("python", "train.py")) -> GangWorkload:
    """Tasks as (name, replicas, GPUs per pod)."""
    replicas = tuple(
        ReplicaSpec(task=task, index=i, gpu_count=gpus, image="img", command=command, env=())
        for task, count, gpus in tasks
        for i in range(count)
    )
    return GangWorkload(
        job_id=JobId("llm-1"),
        attempt=1,
        tenant=TenantId("nlp"),
        gpu_type=GpuType("H100"),
        kind=CapacityKind.ON_DEMAND,
        priority_class="default",
        replicas=replicas,
        min_available=len(replicas),
        max_runtime_s=0,
    )


def run_env(container: dict[str, Any], annotations: dict[str, str]) -> dict[str, str]:
    """The environment the container's command runs with, as a kubelet and its shell make it."""
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            key = path.split("['", 1)[1].rstrip("']")
            env[item["name"]] = annotations[key]
    command = container.get("command") or []
    if command[:2] == ["/bin/sh", "-c"]:
        assert shutil.which("sh") is not None
        script = command[2]
        out = subprocess.run(
            ["/bin/sh", "-c", script, *command[3:4], "env"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return env


def volcano_pods(gang: GangWorkload) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    """(pod name, its template spec, its annotations) for every pod Volcano would make, in rank order."""
    body = manifests.volcano_job(gang, NAME, "gpufed-nlp", SELECTION, master_port=29500)
    pods = []
    for task in body["spec"]["tasks"]:
        for i in range(task["replicas"]):
            notes = {**task["template"]["metadata"]["annotations"], "volcano.sh/task-index": str(i)}
            pods.append((f"{NAME}-{task['name']}-{i}", task["template"]["spec"], notes))
    return pods


def indexed_pods(gang: GangWorkload) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    body = manifests.indexed_job(gang, NAME, "gpufed-nlp", SELECTION, master_port=29500)
    template = body["spec"]["template"]
    return [
        (
            f"{NAME}-{i}",
            template["spec"],
            {**template["metadata"]["annotations"], "batch.kubernetes.io/job-completion-index": str(i)},
        )
        for i in range(body["spec"]["completions"])
    ]


CASES = [
    pytest.param(volcano_pods, (("master", 1, 2), ("worker", 2, 2)), id="volcano-master-and-workers"),
    pytest.param(volcano_pods, (("master", 2, 1), ("worker", 2, 4)), id="volcano-differing-gpus"),
    pytest.param(volcano_pods, (("worker", 3, 1),), id="volcano-one-task-one-gpu"),
    pytest.param(volcano_pods, (("worker", 2, 0),), id="volcano-cpu-pods"),
    pytest.param(indexed_pods, (("worker", 2, 2),), id="indexed-two-gpus"),
    pytest.param(indexed_pods, (("worker", 3, 1),), id="indexed-one-gpu"),
    pytest.param(indexed_pods, (("worker", 1, 8),), id="indexed-single-pod"),
    pytest.param(indexed_pods, (("worker", 2, 0),), id="indexed-cpu-pods"),
]


@pytest.mark.parametrize(("pods_of", "tasks"), CASES)
def test_every_pod_sees_pytorchs_ranks(pods_of: Any, tasks: tuple[tuple[str, int, int], ...]) -> None:
    gang = a_gang(*tasks)
    nprocs = [rendezvous.nproc_per_node(gpus) for _, count, gpus in tasks for _ in range(count)]
    pods = pods_of(gang)
    envs = [run_env(spec["containers"][0], notes) for _, spec, notes in pods]
    first_host = f"{pods[0][0]}.{NAME}"
    for node_rank, (env, nproc) in enumerate(zip(envs, nprocs, strict=True)):
        assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == first_host
        assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == "29500"
        assert env["NNODES"] == env["PET_NNODES"] == str(len(pods))
        assert env["WORLD_SIZE"] == str(sum(nprocs))  # processes, not pods
        assert env["NPROC_PER_NODE"] == env["PET_NPROC_PER_NODE"] == str(nproc)
        assert env["NODE_RANK"] == env["PET_NODE_RANK"] == str(node_rank)
        assert env["RANK"] == str(sum(nprocs[:node_rank]))  # the pod's first process


@pytest.mark.parametrize(("pods_of", "tasks"), CASES)
def test_the_launcher_mounts_a_hostfile_with_slots(
    pods_of: Any, tasks: tuple[tuple[str, int, int], ...]
) -> None:
    pods = pods_of(a_gang(*tasks))
    nprocs = [rendezvous.nproc_per_node(gpus) for _, count, gpus in tasks for _ in range(count)]
    expected = "".join(f"{name}.{NAME} slots={n}\n" for (name, _, _), n in zip(pods, nprocs, strict=True))
    _, spec, notes = pods[0]
    assert notes[rendezvous.HOSTFILE_ANNOTATION] == expected
    main = spec["containers"][0]
    assert {"name": "gpufed-hostfile", "mountPath": "/etc/gpufed", "readOnly": True} in main["volumeMounts"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "gpufed-hostfile"]
    (item,) = volume["downwardAPI"]["items"]
    assert item == {
        "path": "hostfile",
        "fieldRef": {"fieldPath": "metadata.annotations['gpufed.io/hostfile']"},
    }
    assert run_env(main, notes)["GPUFED_HOSTFILE"] == "/etc/gpufed/hostfile"


def test_only_the_launcher_task_gets_the_hostfile_on_volcano() -> None:
    body = manifests.volcano_job(
        a_gang(("master", 1, 1), ("worker", 2, 1)), NAME, "ns", SELECTION, master_port=29500
    )
    master, worker = body["spec"]["tasks"]
    assert rendezvous.HOSTFILE_ANNOTATION in master["template"]["metadata"]["annotations"]
    assert rendezvous.HOSTFILE_ANNOTATION not in worker["template"]["metadata"]["annotations"]
    assert "gpufed-hostfile" not in str(worker["template"]["spec"])


def test_the_prelude_keeps_the_command_and_its_arguments() -> None:
    gang = a_gang(("worker", 2, 2), command=("python", "-c", "import os; print(os.environ['RANK'])"))
    body = manifests.indexed_job(gang, NAME, "ns", SELECTION, master_port=29500)
    command = body["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:4] == ["/bin/sh", "-c", rendezvous.RANK_PRELUDE, rendezvous.PRELUDE_NAME]
    assert command[4:] == ["python", "-c", "import os; print(os.environ['RANK'])"]


def test_ranks_kubernetes_can_write_need_no_shell() -> None:
    # One process per pod in the first task: the index is the rank, copied by a fieldRef.
    body = manifests.indexed_job(a_gang(("worker", 4, 1)), NAME, "ns", SELECTION, master_port=29500)
    main = body["spec"]["template"]["spec"]["containers"][0]
    assert main["command"] == ["python", "train.py"]
    env = {e["name"]: e for e in main["env"]}
    assert env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == rendezvous.COMPLETION_INDEX


def test_an_empty_command_is_left_to_the_image() -> None:
    body = manifests.indexed_job(a_gang(("worker", 2, 2), command=()), NAME, "ns", SELECTION, master_port=1)
    main = body["spec"]["template"]["spec"]["containers"][0]
    assert main["command"] == []
    names = {e["name"] for e in main["env"]}
    assert {"GPUFED_POD_INDEX", "GPUFED_RANK_OFFSET", "WORLD_SIZE"} <= names
    assert "RANK" not in names


def test_the_rendezvous_is_named_per_job_in_the_tenants_namespace() -> None:
    """Another job (or tenant) on the cluster has other names: the hostfile and MASTER_ADDR name only
    this attempt's pods, under its own subdomain, and the objects sit in the tenant's namespace."""
    gang = a_gang(("worker", 2, 1))
    mine = manifests.indexed_job(gang, NAME, "gpufed-nlp", SELECTION, master_port=29500)
    other = manifests.indexed_job(gang, "llm-2-a1", "gpufed-vision", SELECTION, master_port=29500)
    assert mine["metadata"]["namespace"] == "gpufed-nlp"
    service = manifests.headless_service(gang, NAME, "gpufed-nlp", master_port=29500)
    assert service["metadata"]["namespace"] == "gpufed-nlp"
    assert service["spec"]["selector"] == {"gpufed.io/gang": NAME}
    hostfile = mine["spec"]["template"]["metadata"]["annotations"][rendezvous.HOSTFILE_ANNOTATION]
    assert all(line.split()[0].endswith(f".{NAME}") for line in hostfile.splitlines())
    assert "llm-2-a1" not in str(mine)
    assert NAME not in str(other)
