"""The rendezvous a gang's pods get: torchrun's variables, PyTorch's ranks and an MPI hostfile.

Pure builders, no I/O, shared by the Volcano Job and the Indexed Job so that a job sees the same
environment on a cluster with Volcano and on one without. Definitions follow PyTorch's (torchrun's
page, "Environment Variables"): `WORLD_SIZE` counts processes, not pods, and `RANK` is a global
process rank; gpufed sets on each pod the rank of its first process, `NODE_RANK` (torchrun's
`--node-rank`, its `GROUP_RANK`) the pod's place in the gang, and `NPROC_PER_NODE` one process per
GPU (one for a pod without GPUs). The same values go out as torchrun's `PET_*` variables, which its
flags read as defaults, so a bare `torchrun train.py` joins the gang.

A pod's ranks depend on its index, which only the controller that creates it knows. Kubernetes can
copy the index into a variable (a `fieldRef` on the index annotation) but cannot add to it, so a
rank is written that way only when it equals the index; otherwise (a Volcano task after the first,
or several processes per pod) the main container's command runs under a short `/bin/sh` prelude
that computes `NODE_RANK` and `RANK` from the index and exports them before `exec`ing the command.

The hostfile (`host slots=N` lines, the format of Open MPI's and DeepSpeed's `--hostfile`) names
every pod by its stable DNS name `<hostname>.<subdomain>` in rank order, with its process count. It
travels as an annotation of the launcher's pod template and is projected into the launcher pod by
a downward API volume: it needs no ConfigMap, lives and dies with the pod, and is readable only
where the pod is (its namespace, the tenant's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Json = dict[str, Any]

HOSTFILE_ANNOTATION = "gpufed.io/hostfile"
HOSTFILE_VOLUME = "gpufed-hostfile"
HOSTFILE_DIR = "/etc/gpufed"
HOSTFILE_PATH = f"{HOSTFILE_DIR}/hostfile"
# Where each controller writes a pod's index: the Job controller's completion index, Volcano's
# task index (its env plugin's VC_TASK_INDEX holds the same, but is appended after gpufed's env).
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
VOLCANO_TASK_INDEX = "metadata.annotations['volcano.sh/task-index']"
# The prelude: POSIX sh arithmetic on the index; `exec` keeps the command as the container's PID 1.
RANK_PRELUDE = (
    "NODE_RANK=$((GPUFED_NODE_RANK_OFFSET + GPUFED_POD_INDEX)); "
    "RANK=$((GPUFED_RANK_OFFSET + GPUFED_POD_INDEX * NPROC_PER_NODE)); "
    'PET_NODE_RANK=$NODE_RANK; export NODE_RANK RANK PET_NODE_RANK; exec "$@"'
)
PRELUDE_NAME = "gpufed-rendezvous"


def nproc_per_node(gpu_count: int) -> int:
    """One process per GPU, as torchrun's `--nproc-per-node=gpu` would start; one without GPUs."""
    return max(1, gpu_count)


@dataclass(frozen=True, slots=True)
class PodGroup:
    """Pods that share one template (a Volcano task, or all of an Indexed Job's pods).

    `hostnames` are the pods' DNS names in index order; the group's first pod has node rank
    `node_offset` and its first process rank `rank_offset`; `index_field` is where a pod finds its
    index (a fieldRef path)."""

    hostnames: tuple[str, ...]
    nproc: int
    node_offset: int
    rank_offset: int
    index_field: str


@dataclass(frozen=True, slots=True)
class Layout:
    groups: tuple[PodGroup, ...]

    @property
    def master_addr(self) -> str:
        return self.groups[0].hostnames[0]

    @property
    def nnodes(self) -> int:
        return sum(len(g.hostnames) for g in self.groups)

    @property
    def world_size(self) -> int:
        return sum(len(g.hostnames) * g.nproc for g in self.groups)


def layout(groups: Sequence[tuple[Sequence[str], int, str]]) -> Layout:
    """Groups in rank order from (hostnames, processes per pod, index field)."""
    out: list[PodGroup] = []
    node, rank = 0, 0
    for hostnames, nproc, index_field in groups:
        out.append(PodGroup(tuple(hostnames), nproc, node, rank, index_field))
        node += len(hostnames)
        rank += len(hostnames) * nproc
    if not out or not out[0].hostnames:
        raise ValueError("a rendezvous needs at least one pod")
    return Layout(tuple(out))


def hostfile(lay: Layout) -> str:
    """`host slots=N` per pod, in rank order: Open MPI's and DeepSpeed's hostfile format."""
    return "".join(f"{h} slots={g.nproc}\n" for g in lay.groups for h in g.hostnames)


def _value(name: str, value: object) -> Json:
    return {"name": name, "value": str(value)}


def _field(name: str, path: str) -> Json:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def needs_prelude(group: PodGroup) -> bool:
    """True when a pod's ranks are not its index (nor a constant): Kubernetes cannot compute them."""
    if len(group.hostnames) == 1:
        return False
    return group.node_offset != 0 or group.rank_offset != 0 or group.nproc != 1


def environment(lay: Layout, group: PodGroup, master_port: int, *, launcher: bool) -> list[Json]:
    """The variables of one group's pods (see the module's docstring)."""
    env = [
        _value("MASTER_ADDR", lay.master_addr),
        _value("MASTER_PORT", master_port),
        _value("NNODES", lay.nnodes),
        _value("NPROC_PER_NODE", group.nproc),
        _value("WORLD_SIZE", lay.world_size),
        _value("PET_MASTER_ADDR", lay.master_addr),
        _value("PET_MASTER_PORT", master_port),
        _value("PET_NNODES", lay.nnodes),
        _value("PET_NPROC_PER_NODE", group.nproc),
        _value("GPUFED_NODE_RANK_OFFSET", group.node_offset),
        _value("GPUFED_RANK_OFFSET", group.rank_offset),
    ]
    if len(group.hostnames) == 1:
        env += [
            _value("GPUFED_POD_INDEX", 0),
            _value("NODE_RANK", group.node_offset),
            _value("PET_NODE_RANK", group.node_offset),
            _value("RANK", group.rank_offset),
        ]
    else:
        env.append(_field("GPUFED_POD_INDEX", group.index_field))
        if not needs_prelude(group):
            env += [
                _field("NODE_RANK", group.index_field),
                _field("PET_NODE_RANK", group.index_field),
                _field("RANK", group.index_field),
            ]
    if launcher:
        env.append(_value("GPUFED_HOSTFILE", HOSTFILE_PATH))
    return env


def wrap_command(command: Sequence[str]) -> list[str]:
    """The container's command run under the rank prelude; an empty command (the image's own
    entrypoint, which gpufed cannot see) is left as it is, without NODE_RANK and RANK."""
    if not command:
        return []
    return ["/bin/sh", "-c", RANK_PRELUDE, PRELUDE_NAME, *command]


def mount_hostfile(spec: Json, main: Json) -> None:
    """Project the pod's hostfile annotation into the main container at HOSTFILE_PATH."""
    spec["volumes"] = [
        *(spec.get("volumes") or []),
        {
            "name": HOSTFILE_VOLUME,
            "downwardAPI": {
                "items": [
                    {
                        "path": "hostfile",
                        "fieldRef": {"fieldPath": f"metadata.annotations['{HOSTFILE_ANNOTATION}']"},
                    }
                ]
            },
        },
    ]
    main["volumeMounts"] = [
        *(main.get("volumeMounts") or []),
        {"name": HOSTFILE_VOLUME, "mountPath": HOSTFILE_DIR, "readOnly": True},
    ]
