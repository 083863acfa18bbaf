"""`federation.spec.pod_template`: a task's pod template is checked at submission, errors name the field.

Each case edits one part of a valid templated task and checks the field path and a phrase of the
rule: the Kubernetes schema (the official client's models), the API server's own rules, and what
gpufed owns.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from clusters.kubernetes import inventory
from federation.errors import InvalidSpec
from federation.spec import pod_template
from federation.spec.priorities import DEFAULT_PRIORITY_CLASSES
from federation.spec.training_job import parse_manifest, render_manifest

CLASSES = DEFAULT_PRIORITY_CLASSES.keys()
T = "spec.tasks[0].template"
C = f"{T}.spec.containers[0]"


def a_template() -> dict[str, Any]:
    return {
        "metadata": {"labels": {"team": "nlp"}, "annotations": {"owner": "ana@example.com"}},
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "image": "ghcr.io/example/train:1",
                    "args": ["train.py"],
                    "workingDir": "/workspace",
                    "ports": [{"containerPort": 29500, "name": "c10d"}],
                    "resources": {"requests": {"cpu": 8, "memory": "64Gi"}, "limits": {"memory": "128Gi"}},
                    "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}],
                    "envFrom": [{"configMapRef": {"name": "train-config"}}],
                    "env": [{"name": "HF_HOME", "value": "/cache"}],
                }
            ],
            "initContainers": [{"name": "fetch", "image": "busybox", "command": ["true"]}],
            "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}],
            "nodeSelector": {"topology.kubernetes.io/zone": "dc1-a"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1", "r2"]}]}
                        ]
                    }
                }
            },
            "securityContext": {"runAsUser": 1000, "fsGroup": 1000},
            "imagePullSecrets": [{"name": "regcred"}],
        },
    }


def a_manifest(template: dict[str, Any] | None = None, **task: Any) -> str:
    entry: dict[str, Any] = {"name": "worker", "replicas": 2, "gpus": 8, **task}
    if template is not None:
        entry["template"] = template
    doc = {
        "apiVersion": "gpufed.io/v1",
        "kind": "TrainingJob",
        "metadata": {"name": "llm"},
        "spec": {"gpuTypes": ["H100"], "tasks": [entry]},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def refused(text: str) -> InvalidSpec:
    with pytest.raises(InvalidSpec) as caught:
        parse_manifest(text, priority_classes=CLASSES)
    return caught.value


def edited(path: str, value: Any) -> dict[str, Any]:
    """The template with one dotted path (`spec.containers.0.name`) set, or removed when DELETE."""
    template = copy.deepcopy(a_template())
    *parents, last = path.split(".")
    node: Any = template
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    key: Any = int(last) if last.isdigit() else last
    if value is DELETE:
        del node[key]
    else:
        node[key] = value
    return template


DELETE = object()


def test_a_full_template_parses_and_renders_back_to_itself() -> None:
    spec = parse_manifest(a_manifest(a_template(), shmSize="16Gi"), priority_classes=CLASSES)
    task = spec.tasks[0]
    assert task.image == "ghcr.io/example/train:1"  # the main container's image is the task's
    assert task.shm_size == "16Gi"
    stored = json.loads(task.template)
    main = stored["spec"]["containers"][0]
    assert "image" not in main
    assert main["resources"]["requests"]["cpu"] == "8"  # a JSON number read as a quantity
    assert main["workingDir"] == "/workspace"
    assert parse_manifest(render_manifest(spec), priority_classes=CLASSES) == spec


def test_short_form_is_unchanged_and_has_no_template() -> None:
    spec = parse_manifest(
        a_manifest(image="pytorch/pytorch:2.3", command=["python"]), priority_classes=CLASSES
    )
    assert spec.tasks[0].template == ""
    assert spec.tasks[0].shm_size == ""
    assert "template" not in render_manifest(spec)


def test_main_container_defaults_to_the_task_name() -> None:
    template = {"spec": {"containers": [{"resources": {"requests": {"memory": "1Gi"}}}]}}
    spec = parse_manifest(a_manifest(template, image="busybox"), priority_classes=CLASSES)
    assert json.loads(spec.tasks[0].template)["spec"]["containers"][0]["name"] == "worker"


CASES = [
    # The Kubernetes schema (the official client's models).
    ("unknown pod field", edited("spec.contaners", []), f"{T}.spec.contaners", "did you mean 'containers'"),
    (
        "snake_case",
        edited("spec.containers.0.working_dir", "/x"),
        f"{C}.working_dir",
        "did you mean 'workingDir'",
    ),
    (
        "port as text",
        edited("spec.containers.0.ports.0.containerPort", "80"),
        f"{C}.ports[0].containerPort",
        "must be an integer",
    ),
    ("bool as text", edited("spec.containers.0.tty", "yes"), f"{C}.tty", "true or false"),
    (
        "volume mount without path",
        edited("spec.containers.0.volumeMounts.0.mountPath", DELETE),
        f"{C}.volumeMounts[0].mountPath",
        "is required",
    ),
    (
        "toleration seconds as text",
        edited("spec.tolerations.0.tolerationSeconds", "5"),
        f"{T}.spec.tolerations[0].tolerationSeconds",
        "integer",
    ),
    ("template key", {"spec": {}, "status": {}}, f"{T}.status", "unknown field"),
    ("metadata name", edited("metadata.name", "mine"), f"{T}.metadata.name", "only labels and annotations"),
    # The API server's own rules.
    (
        "bad memory",
        edited("spec.containers.0.resources.limits.memory", "128 GiB"),
        f"{C}.resources.limits.memory",
        "Kubernetes quantity",
    ),
    (
        "negative cpu",
        edited("spec.containers.0.resources.requests.cpu", "-1"),
        f"{C}.resources.requests.cpu",
        "greater than or equal to 0",
    ),
    (
        "request over limit",
        edited("spec.containers.0.resources.requests.memory", "256Gi"),
        f"{C}.resources.requests.memory",
        "less than or equal to the limit",
    ),
    (
        "mount of no volume",
        edited("spec.containers.0.volumeMounts.0.name", "data"),
        f"{C}.volumeMounts[0].name",
        "no volume named 'data'",
    ),
    (
        "volume of two types",
        edited("spec.volumes.0.emptyDir", {}),
        f"{T}.spec.volumes[0]",
        "more than 1 volume type",
    ),
    (
        "volume of no type",
        edited("spec.volumes.0", {"name": "ckpt"}),
        f"{T}.spec.volumes[0]",
        "must specify a volume type",
    ),
    ("container name", edited("spec.containers.0.name", "Trainer"), f"{C}.name", "DNS-1123 label"),
    (
        "same container name",
        edited("spec.initContainers.0.name", "trainer"),
        f"{T}.spec.initContainers[0].name",
        "duplicate container name",
    ),
    (
        "init without image",
        edited("spec.initContainers.0.image", DELETE),
        f"{T}.spec.initContainers[0].image",
        "is required",
    ),
    (
        "port 0",
        edited("spec.containers.0.ports.0.containerPort", 0),
        f"{C}.ports[0].containerPort",
        "from 1 to 65535",
    ),
    (
        "protocol",
        edited("spec.containers.0.ports.0.protocol", "HTTP"),
        f"{C}.ports[0].protocol",
        "TCP, UDP or SCTP",
    ),
    (
        "toleration operator",
        edited("spec.tolerations.0.operator", "Is"),
        f"{T}.spec.tolerations[0].operator",
        "Equal or Exists",
    ),
    (
        "toleration effect",
        edited("spec.tolerations.0.effect", "Never"),
        f"{T}.spec.tolerations[0].effect",
        "NoSchedule",
    ),
    (
        "pull secret name",
        edited("spec.imagePullSecrets.0", {}),
        f"{T}.spec.imagePullSecrets[0].name",
        "is required",
    ),
    ("label value", edited("metadata.labels.team", "n l p"), f'{T}.metadata.labels["team"]', "value must be"),
    (
        "control character",
        edited("spec.containers.0.args.0", "train\x1b[2J.py"),
        f"{C}.args[0]",
        "control or bidirectional",
    ),
    (
        "ephemeral containers",
        edited("spec.ephemeralContainers", [{"name": "debug", "image": "busybox"}]),
        f"{T}.spec.ephemeralContainers",
        "may not be set when a pod is created",
    ),
    # What gpufed owns.
    (
        "gpu limit",
        edited("spec.containers.0.resources.limits", {"nvidia.com/gpu": "8"}),
        f'{C}.resources.limits["nvidia.com/gpu"]',
        "gpufed owns the GPU request",
    ),
    (
        "scheduler",
        edited("spec.schedulerName", "default-scheduler"),
        f"{T}.spec.schedulerName",
        "gpufed owns this field",
    ),
    (
        "restart policy",
        edited("spec.restartPolicy", "Always"),
        f"{T}.spec.restartPolicy",
        "gpufed owns this field",
    ),
    ("node name", edited("spec.nodeName", "n1"), f"{T}.spec.nodeName", "gpufed owns this field"),
    (
        "gpu product selector",
        edited("spec.nodeSelector", {"nvidia.com/gpu.product": "NVIDIA-H100"}),
        f'{T}.spec.nodeSelector["nvidia.com/gpu.product"]',
        "gpufed chooses the GPU type",
    ),
    (
        "spot selector",
        edited("spec.nodeSelector", {"cloud.google.com/gke-spot": "true"}),
        f'{T}.spec.nodeSelector["cloud.google.com/gke-spot"]',
        "gpufed chooses",
    ),
    (
        "gpu affinity",
        edited(
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms.0.matchExpressions.0.key",
            "nvidia.com/gpu.memory",
        ),
        f"{T}.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key",
        "gpufed chooses",
    ),
    (
        "gpufed label",
        edited("metadata.labels", {"gpufed.io/job-id": "other"}),
        f'{T}.metadata.labels["gpufed.io/job-id"]',
        "gpufed owns this label",
    ),
    (
        "volcano annotation",
        edited("metadata.annotations", {"scheduling.k8s.io/group-name": "x"}),
        f'{T}.metadata.annotations["scheduling.k8s.io/group-name"]',
        "gpufed owns this annotation",
    ),
    (
        "rendezvous env",
        edited("spec.containers.0.env.0.name", "MASTER_ADDR"),
        f"{C}.env[0].name",
        "set by gpufed",
    ),
    (
        "gpufed env",
        edited("spec.containers.0.env.0.name", "GPUFED_RANK_OFFSET"),
        f"{C}.env[0].name",
        "set by gpufed",
    ),
    ("gpufed volume", edited("spec.volumes.0.name", "gpufed-ckpt"), f"{T}.spec.volumes[0].name", "gpufed's"),
]


@pytest.mark.parametrize(("template", "field", "phrase"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_template_errors_name_the_field(template: dict[str, Any], field: str, phrase: str) -> None:
    error = refused(a_manifest(template))
    assert error.field == field
    assert phrase in error.rule


def test_image_set_twice_or_nowhere() -> None:
    assert refused(a_manifest(a_template(), image="busybox")).field == f"{C}.image"
    template = edited("spec.containers.0.image", DELETE)
    error = refused(a_manifest(template))
    assert error.field == "spec.tasks[0].image"
    assert "template.spec.containers[0].image" in error.rule


def test_env_names_not_repeated_between_short_form_and_template() -> None:
    error = refused(a_manifest(a_template(), env={"HF_HOME": "/other"}))
    assert error.field == f"{C}.env[0].name"
    assert "duplicate" in error.rule


def test_short_env_may_not_set_the_rendezvous() -> None:
    error = refused(a_manifest(image="busybox", env={"WORLD_SIZE": "4"}))
    assert error.field == 'spec.tasks[0].env["WORLD_SIZE"]'
    assert "gpufed" in error.rule


@pytest.mark.parametrize(
    ("value", "phrase"), [("16 Gi", "quantity"), ("0", "more than 0"), (True, "quantity"), (1.5, "quantity")]
)
def test_shm_size_is_a_positive_quantity(value: Any, phrase: str) -> None:
    error = refused(a_manifest(image="busybox", shmSize=value))
    assert error.field == "spec.tasks[0].shmSize"
    assert phrase in error.rule


def test_shm_size_and_a_dev_shm_mount_conflict() -> None:
    template = edited("spec.containers.0.volumeMounts.0.mountPath", "/dev/shm")
    error = refused(a_manifest(template, shmSize="8Gi"))
    assert error.field == f"{C}.volumeMounts"
    assert "shmSize mounts /dev/shm" in error.rule


def test_shm_size_expands_to_a_memory_empty_dir_in_every_container() -> None:
    spec = parse_manifest(a_manifest(a_template(), shmSize="16Gi"), priority_classes=CLASSES)
    task = spec.tasks[0]
    expanded = json.loads(pod_template.expanded_template(task.template, task.shm_size))
    assert {"name": "gpufed-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in expanded["spec"][
        "volumes"
    ]
    for key in ("containers", "initContainers"):
        for container in expanded["spec"][key]:
            assert {"name": "gpufed-shm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    # A short-form task gets a template of its own for it.
    short = pod_template.expanded_template("", "1Gi")
    assert json.loads(short)["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] == "1Gi"
    assert pod_template.expanded_template("", None) == ""


def test_owned_node_labels_cover_those_the_inventory_selects_by() -> None:
    """A template that could select by a label gpufed selects nodes with would undo the placement."""
    for key in (inventory.PRODUCT_LABEL, *inventory.POOL_LABELS, *inventory.SPOT_LABELS):
        assert pod_template._owned_node_label(key), key


def test_a_template_within_the_size_limit_parses_and_a_bigger_manifest_is_refused() -> None:
    """The manifest limit (256 KiB) holds with templates: a large template inside it parses."""
    template = a_template()
    template["spec"]["containers"][0]["args"] = [f"--flag-{i}=" + "x" * 100 for i in range(3000)]
    error = refused(a_manifest(template))
    assert error.field == "manifest"
    template["spec"]["containers"][0]["args"] = [f"--flag-{i}" for i in range(200)]
    parse_manifest(a_manifest(template), priority_classes=CLASSES)
