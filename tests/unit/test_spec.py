"""`federation.spec.training_job`: every rule names its field, defaults are filled in, hostile input is refused.

Most cases edit one field of a valid manifest (built as a dict, then dumped to YAML) and check the
field path and a phrase of the rule. Loader-level cases (aliases, duplicate keys, ...) are raw text.
"""

from __future__ import annotations

import contextlib
import json
import operator
import string
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from federation.errors import InvalidSpec
from federation.spec import manifest_text as loader_module
from federation.spec.jobspec import DatasetRef, RestartAction, RestartPolicy, TaskSpec, TrainingJobSpec
from federation.spec.manifest_text import MAX_DEPTH, MAX_MANIFEST_BYTES, MAX_VALUES
from federation.spec.priorities import DEFAULT_PRIORITY_CLASSES
from federation.spec.training_job import (
    manifest_digest,
    parse_manifest,
    render_manifest,
)
from placement.model import GpuType, GpuTypePolicy, TenantId
from tests.properties import examples

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CLASSES = DEFAULT_PRIORITY_CLASSES.keys()
DELETE = object()
BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
PROPERTY = settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- builders


def a_task(name: str = "worker", *, replicas: int = 4, gpus: int = 8, **extra: Any) -> dict[str, Any]:
    return {"name": name, "replicas": replicas, "image": "pytorch/pytorch:2.3", "gpus": gpus, **extra}


def a_manifest() -> dict[str, Any]:
    return {
        "apiVersion": "gpufed.io/v1",
        "kind": "TrainingJob",
        "metadata": {
            "name": "resnet50",
            "labels": {"team": "vision"},
            "annotations": {"sim.gpufed.io/duration": "4s"},
        },
        "spec": {
            "tenant": "vision",
            "gpuTypes": ["H100", "A100"],
            "tasks": [
                a_task("master", replicas=1, command=["python", "train.py"], env={"EPOCHS": "10"}),
                a_task("worker", replicas=4),
            ],
        },
    }


MINIMAL = """\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {name: tiny}
spec:
  gpuTypes: [A100]
  tasks:
    - {name: worker, replicas: 2, image: "pytorch/pytorch:2.3", gpus: 1}
"""


def edited(path: str | tuple[str | int, ...], value: object) -> dict[str, Any]:
    """A valid manifest with one field set (or removed with DELETE); "spec.tasks.1.gpus" style paths."""
    doc = a_manifest()
    keys = [int(k) if k.isdigit() else k for k in path.split(".")] if isinstance(path, str) else list(path)
    node: Any = doc
    for key in keys[:-1]:
        node = node.setdefault(key, {}) if isinstance(node, dict) else node[key]
    if value is DELETE:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return doc


def dump(doc: object) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def parse(text: str | bytes, classes: Any = CLASSES) -> TrainingJobSpec:
    return parse_manifest(text, priority_classes=classes)


def rejection(text: str | bytes, classes: Any = CLASSES) -> InvalidSpec:
    with pytest.raises(InvalidSpec) as caught:
        parse(text, classes)
    return caught.value


# ---- field rules


def p(path: Any, value: object, field: str, phrase: str, id: str) -> Any:
    return pytest.param(path, value, field, phrase, id=id)


# Tables read best with one case a line, so the formatter leaves them alone.
# fmt: off
FIELD_RULES = [
    # top level
    p("apiVersion", DELETE, "apiVersion", "is required", "api-version-missing"),
    p("apiVersion", "gpufed.io/v2", "apiVersion", "must be 'gpufed.io/v1'", "api-version-wrong"),
    p("kind", "Job", "kind", "must be 'TrainingJob'", "kind-wrong"),
    p("status", {}, "status", "unknown field 'status'", "unknown-top-level-field"),
    p("spec.tasks.0.replica", 1, "spec.tasks[0].replica", "did you mean 'replicas'?", "unknown-field-suggests"),
    p("spec.gpuType", ["A100"], "spec.gpuType", "did you mean 'gpuTypes'?", "unknown-spec-field-suggests"),
    p("spec.zzz", 1, "spec.zzz", "expected one of: tenant,", "unknown-field-lists-allowed"),
    # metadata
    p("metadata", DELETE, "metadata", "is required", "metadata-missing"),
    p("metadata", ["resnet"], "metadata", "must be a mapping, got a list", "metadata-not-mapping"),
    p("metadata.name", DELETE, "metadata.name", "is required", "name-missing"),
    p("metadata.name", "ResNet", "metadata.name", "DNS-1123 label", "name-uppercase"),
    p("metadata.name", "a" * 64, "metadata.name", "at most 63", "name-too-long"),
    p("metadata.name", "-resnet", "metadata.name", "DNS-1123 label", "name-leading-dash"),
    p("metadata.name", "resnet\n", "metadata.name", "DNS-1123 label", "name-trailing-newline"),
    p("metadata.name", 5, "metadata.name", "must be a string, got 5", "name-not-string"),
    p("metadata.labels", ["team"], "metadata.labels", "must be a mapping", "labels-not-mapping"),
    p("metadata.labels", {f"k{i}": "v" for i in range(65)}, "metadata.labels", "at most 64 entries, got 65", "labels-too-many"),
    p(("metadata", "labels", "bad key"), "v", 'metadata.labels["bad key"]', "key name must be", "label-key-space"),
    p(("metadata", "labels", "a" * 64), "v", 'metadata.labels["' + "a" * 60 + '..."]', "key name must be 1 to 63", "label-key-too-long"),
    p(("metadata", "labels", "Example.com/team"), "v", 'metadata.labels["Example.com/team"]', "key prefix must be a DNS subdomain", "label-key-bad-prefix"),
    p(("metadata", "labels", "/team"), "v", 'metadata.labels["/team"]', "key prefix", "label-key-empty-prefix"),
    p(("metadata", "labels", "a/b/c"), "v", 'metadata.labels["a/b/c"]', "key prefix", "label-key-two-slashes"),
    p("metadata.labels.team", "x" * 64, 'metadata.labels["team"]', "value must be empty or 1 to 63", "label-value-too-long"),
    p("metadata.labels.team", "vision team", 'metadata.labels["team"]', "value must be", "label-value-space"),
    p("metadata.labels.team", "-vision", 'metadata.labels["team"]', "value must be", "label-value-leading-dash"),
    p("metadata.labels.team", 5, 'metadata.labels["team"]', "must be a string, got 5; quote it", "label-value-number"),
    p("metadata.labels.team", True, 'metadata.labels["team"]', "must be a string, got true (a boolean)", "label-value-bool"),
    p("metadata.annotations", "x", "metadata.annotations", "must be a mapping", "annotations-not-mapping"),
    p(("metadata", "annotations", "bad key!"), "x", 'metadata.annotations["bad key!"]', "key name", "annotation-key-bad"),
    p(("metadata", "annotations", "note"), 3, 'metadata.annotations["note"]', "must be a string, got 3", "annotation-value-number"),
    p("metadata.annotations", {"big": "x" * 70_000}, "metadata.annotations", "at most 65536 bytes, got 70003", "annotations-too-large"),
    # spec scalars
    p("spec", DELETE, "spec", "is required", "spec-missing"),
    p("spec", "run it", "spec", "must be a mapping", "spec-not-mapping"),
    p("spec.tenant", "Vision", "spec.tenant", "DNS-1123 label", "tenant-uppercase"),
    p("spec.tenant", 42, "spec.tenant", "must be a string", "tenant-number"),
    p("spec.priorityClassName", "premium", "spec.priorityClassName", "must be one of high, low, normal, urgent, got 'premium'", "priority-unknown"),
    p("spec.priorityClassName", "hihg", "spec.priorityClassName", "did you mean 'high'?", "priority-typo-suggests"),
    p("spec.priorityClassName", 1000, "spec.priorityClassName", "must be a string", "priority-number"),
    p("spec.gpuTypes", DELETE, "spec.gpuTypes", "is required", "gpu-types-missing"),
    p("spec.gpuTypes", [], "spec.gpuTypes", "from 1 to 8 items, got 0", "gpu-types-empty"),
    p("spec.gpuTypes", [f"G{i}" for i in range(9)], "spec.gpuTypes", "from 1 to 8 items, got 9", "gpu-types-too-many"),
    p("spec.gpuTypes", "A100", "spec.gpuTypes", "must be a list, got 'A100' (a string)", "gpu-types-not-list"),
    p("spec.gpuTypes", ["A100", "H100", "A100"], "spec.gpuTypes[2]", "duplicate GPU type 'A100' (also spec.gpuTypes[0])", "gpu-types-duplicate"),
    p("spec.gpuTypes", ["H 100"], "spec.gpuTypes[0]", "GPU type name", "gpu-type-space"),
    p("spec.gpuTypes", ["A" * 33], "spec.gpuTypes[0]", "GPU type name", "gpu-type-too-long"),
    p("spec.gpuTypes", ["-A100"], "spec.gpuTypes[0]", "GPU type name", "gpu-type-leading-dash"),
    p("spec.gpuTypes", ["A100", 4090], "spec.gpuTypes[1]", "must be a string, got 4090; quote it", "gpu-type-number"),
    p("spec.gpuTypePolicy", "ordered", "spec.gpuTypePolicy", "did you mean 'Ordered'?", "policy-lowercase"),
    p("spec.gpuTypePolicy", "Cheapest", "spec.gpuTypePolicy", "must be one of Ordered, Any, got 'Cheapest'", "policy-unknown"),
    p("spec.gpuTypePolicy", ["Any"], "spec.gpuTypePolicy", "must be one of Ordered, Any, got a list", "policy-list"),
    p("spec.minAvailable", 0, "spec.minAvailable", "from 1 to 5 (the job's total replicas), got 0", "min-available-zero"),
    p("spec.minAvailable", 6, "spec.minAvailable", "from 1 to 5", "min-available-above-replicas"),
    p("spec.minAvailable", "3", "spec.minAvailable", "got '3' (a string)", "min-available-string"),
    p("spec.maxRuntime", 0, "spec.maxRuntime", "more than 0 and at most 30d", "max-runtime-zero"),
    p("spec.maxRuntime", -5, "spec.maxRuntime", "more than 0", "max-runtime-negative"),
    p("spec.maxRuntime", "31d", "spec.maxRuntime", "at most 30d (2592000 seconds), got 2678400", "max-runtime-31-days"),
    p("spec.maxRuntime", 2_592_001, "spec.maxRuntime", "at most 30d", "max-runtime-seconds-over"),
    p("spec.maxRuntime", "1.5h", "spec.maxRuntime", "duration like '90s', '45m', '1h30m' or '2d'", "max-runtime-fraction"),
    p("spec.maxRuntime", "90", "spec.maxRuntime", "duration like", "max-runtime-no-unit"),
    p("spec.maxRuntime", "30m1h", "spec.maxRuntime", "duration like", "max-runtime-units-out-of-order"),
    p("spec.maxRuntime", "", "spec.maxRuntime", "duration like", "max-runtime-empty"),
    p("spec.maxRuntime", "9" * 20 + "s", "spec.maxRuntime", "duration like", "max-runtime-huge-number"),
    p("spec.maxRuntime", True, "spec.maxRuntime", "got true (a boolean)", "max-runtime-bool"),
    p("spec.maxRuntime", 3600.5, "spec.maxRuntime", "got 3600.5", "max-runtime-float"),
    p("spec.allowSpot", "true", "spec.allowSpot", "a YAML boolean, not a string), got 'true' (a string)", "allow-spot-string"),
    p("spec.allowSpot", 1, "spec.allowSpot", "must be true or false", "allow-spot-number"),
    p("spec.resumable", "yes", "spec.resumable", "a YAML boolean, not a string), got 'yes' (a string)", "resumable-string"),
    p("spec.deadline", datetime(2026, 12, 1, 12), "spec.deadline", "got 2026-12-01T12:00:00 without a timezone", "deadline-naive-datetime"),
    p("spec.deadline", date(2026, 12, 1), "spec.deadline", "got a date (2026-12-01)", "deadline-date-only"),
    p("spec.deadline", "2026-12-01T12:00:00", "spec.deadline", "RFC 3339 timestamp with a timezone", "deadline-string-naive"),
    p("spec.deadline", "tomorrow", "spec.deadline", "RFC 3339", "deadline-garbage"),
    p("spec.deadline", 1_796_126_400, "spec.deadline", "RFC 3339", "deadline-epoch-number"),
    p("spec.deadline", "2026-02-30T00:00:00Z", "spec.deadline", "day is out of range", "deadline-impossible-day"),
    p("spec.deadline", "2026-12-01T12:00:00+25:00", "spec.deadline", "RFC 3339", "deadline-offset-too-large"),
    p("spec.deadline", "1969-12-31T23:59:59Z", "spec.deadline", "between 1970-01-01T00:00:00Z and", "deadline-before-epoch"),
    p("spec.dataset", "ImageNet", "spec.dataset", "'name' or 'name@version'", "dataset-uppercase"),
    p("spec.dataset", "imagenet@", "spec.dataset", "'name' or 'name@version'", "dataset-empty-version"),
    p("spec.dataset", "imagenet@v 1", "spec.dataset", "version of 1 to 64", "dataset-version-space"),
    p("spec.dataset", "a" * 254, "spec.dataset", "at most 253", "dataset-name-too-long"),
    p("spec.dataset", 5, "spec.dataset", "or {name, version}, got 5", "dataset-number"),
    p("spec.dataset", {"name": "imagenet", "vresion": "v1"}, "spec.dataset.vresion", "did you mean 'version'?", "dataset-unknown-key"),
    p("spec.dataset", {"version": "v1"}, "spec.dataset.name", "is required", "dataset-name-missing"),
    p("spec.dataset", {"name": "imagenet", "version": 3}, "spec.dataset.version", "must be a string, got 3; quote it", "dataset-version-number"),
    p("spec.dataset", {"name": "Image_Net"}, "spec.dataset.name", "dataset name", "dataset-mapping-bad-name"),
    p("spec.restartPolicy", "Never", "spec.restartPolicy", "must be a mapping", "restart-policy-not-mapping"),
    p("spec.restartPolicy.onFailure", "Restart", "spec.restartPolicy.onFailure", "did you mean 'RestartJob'?", "restart-on-failure-typo"),
    p("spec.restartPolicy.onEviction", "Ignore", "spec.restartPolicy.onEviction", "must be one of RestartJob, AbortJob", "restart-on-eviction-unknown"),
    p("spec.restartPolicy.maxRetries", 101, "spec.restartPolicy.maxRetries", "from 0 to 100, got 101", "max-retries-too-many"),
    p("spec.restartPolicy.maxRetries", -1, "spec.restartPolicy.maxRetries", "from 0 to 100", "max-retries-negative"),
    p("spec.restartPolicy.backoffLimit", 3, "spec.restartPolicy.backoffLimit", "unknown field", "restart-policy-unknown-key"),
    # tasks
    p("spec.tasks", DELETE, "spec.tasks", "is required", "tasks-missing"),
    p("spec.tasks", [], "spec.tasks", "from 1 to 16 items, got 0", "tasks-empty"),
    p("spec.tasks", [a_task(f"t{i}", replicas=1) for i in range(17)], "spec.tasks", "from 1 to 16 items, got 17", "tasks-too-many"),
    p("spec.tasks", a_task(), "spec.tasks", "must be a list, got a mapping", "tasks-not-list"),
    p("spec.tasks.1", "worker", "spec.tasks[1]", "must be a mapping", "task-not-mapping"),
    p("spec.tasks.1.name", "master", "spec.tasks[1].name", "duplicate task name 'master' (also spec.tasks[0])", "task-name-duplicate"),
    p("spec.tasks.0.name", "Master", "spec.tasks[0].name", "DNS-1123 label", "task-name-uppercase"),
    p("spec.tasks.0.name", DELETE, "spec.tasks[0].name", "is required", "task-name-missing"),
    p("spec.tasks.1.replicas", 0, "spec.tasks[1].replicas", "must be an integer from 1 to 1024, got 0", "replicas-zero"),
    p("spec.tasks.1.replicas", 1025, "spec.tasks[1].replicas", "from 1 to 1024, got 1025", "replicas-too-many"),
    p("spec.tasks.1.replicas", True, "spec.tasks[1].replicas", "got true (a boolean)", "replicas-bool"),
    p("spec.tasks.1.replicas", "4", "spec.tasks[1].replicas", "got '4' (a string)", "replicas-string"),
    p("spec.tasks.1.replicas", 2.5, "spec.tasks[1].replicas", "got 2.5", "replicas-float"),
    p("spec.tasks.1.replicas", None, "spec.tasks[1].replicas", "got null", "replicas-null"),
    p("spec.tasks.1.replicas", DELETE, "spec.tasks[1].replicas", "is required", "replicas-missing"),
    p("spec.tasks.0.gpus", 17, "spec.tasks[0].gpus", "from 0 to 16, got 17", "gpus-too-many"),
    p("spec.tasks.0.gpus", -1, "spec.tasks[0].gpus", "from 0 to 16, got -1", "gpus-negative"),
    p("spec.tasks.0.gpus", DELETE, "spec.tasks[0].gpus", "is required", "gpus-missing"),
    p("spec.tasks", [a_task("a", replicas=1000, gpus=1), a_task("b", replicas=25, gpus=0)], "spec.tasks", "total replicas across tasks must be at most 1024, got 1025", "total-replicas-over"),
    p("spec.tasks", [a_task("a", gpus=0), a_task("b", gpus=0)], "spec.tasks", "1 to 4096 GPUs in all (replicas x gpus, summed), got 0", "total-gpus-zero"),
    p("spec.tasks", [a_task("a", replicas=600, gpus=8)], "spec.tasks", "1 to 4096 GPUs in all (replicas x gpus, summed), got 4800", "total-gpus-over"),
    p("spec.tasks.0.image", DELETE, "spec.tasks[0].image", "is required", "image-missing"),
    p("spec.tasks.0.image", "", "spec.tasks[0].image", "container image reference", "image-empty"),
    p("spec.tasks.0.image", "pytorch/pytorch 2.3", "spec.tasks[0].image", "without whitespace", "image-space"),
    p("spec.tasks.0.image", "x" * 513, "spec.tasks[0].image", "1 to 512 characters", "image-too-long"),
    p("spec.tasks.0.image", 23, "spec.tasks[0].image", "must be a string", "image-number"),
    p("spec.tasks.0.command", "python train.py", "spec.tasks[0].command", "must be a list", "command-string"),
    p("spec.tasks.0.command", ["python", 10], "spec.tasks[0].command[1]", "must be a string, got 10; quote it", "command-item-number"),
    p("spec.tasks.0.command", ["x"] * 257, "spec.tasks[0].command", "from 0 to 256 items, got 257", "command-too-many-items"),
    p("spec.tasks.0.command", ["x" * 4097], "spec.tasks[0].command[0]", "at most 4096 characters, got 4097", "command-item-too-long"),
    p("spec.tasks.0.env", {"EPOCHS": 10}, 'spec.tasks[0].env["EPOCHS"]', "must be a string, got 10; quote it", "env-value-number"),
    p("spec.tasks.0.env", {"DEBUG": True}, 'spec.tasks[0].env["DEBUG"]', "got true (a boolean); quote it", "env-value-bool"),
    p("spec.tasks.0.env", {"EMPTY": None}, 'spec.tasks[0].env["EMPTY"]', "got null; quote it", "env-value-null"),
    p("spec.tasks.0.env", {"1BAD": "x"}, 'spec.tasks[0].env["1BAD"]', "variable name", "env-name-leading-digit"),
    p("spec.tasks.0.env", {"MY-VAR": "x"}, 'spec.tasks[0].env["MY-VAR"]', "variable name", "env-name-dash"),
    p("spec.tasks.0.env", [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}], "spec.tasks[0].env[1].name", "duplicate variable 'A' (also at spec.tasks[0].env[0].name)", "env-list-duplicate"),
    p("spec.tasks.0.env", [{"name": "A", "valeu": "1"}], "spec.tasks[0].env[0].valeu", "did you mean 'value'?", "env-list-unknown-key"),
    p("spec.tasks.0.env", [{"name": "A"}], "spec.tasks[0].env[0].value", "is required", "env-list-value-missing"),
    p("spec.tasks.0.env", [{"name": "A", "value": 1}], "spec.tasks[0].env[0].value", "must be a string, got 1", "env-list-value-number"),
    p("spec.tasks.0.env", ["A=1"], "spec.tasks[0].env[0]", "must be a mapping", "env-list-item-string"),
    p("spec.tasks.0.env", {f"V{i}": "x" for i in range(257)}, "spec.tasks[0].env", "at most 256 variables, got 257", "env-too-many"),
    p("spec.tasks.0.env", "A=1", "spec.tasks[0].env", "mapping of names to strings or a list of {name, value}", "env-string"),
]
# fmt: on


@pytest.mark.parametrize(("path", "value", "field", "phrase"), FIELD_RULES)
def test_a_broken_rule_names_the_field_and_the_rule(
    path: Any, value: object, field: str, phrase: str
) -> None:
    error = rejection(dump(edited(path, value)))
    assert (error.field, phrase in error.rule) == (field, True), error.rule


def test_the_base_manifest_of_the_rule_table_is_valid() -> None:
    spec = parse(dump(a_manifest()))
    assert spec.replica_count == 5
    assert spec.gpu_count == 40


def test_the_default_priority_class_must_be_configured_when_none_is_given() -> None:
    error = rejection(MINIMAL, classes={"low", "high"})
    assert error.field == "spec.priorityClassName"
    assert "default 'normal' is not configured (high, low)" in error.rule


def test_a_priority_class_from_the_given_collection_is_accepted() -> None:
    text = dump(edited("spec.priorityClassName", "batch"))
    assert parse(text, classes=["batch", "normal"]).priority_class == "batch"


# ---- loader-level refusals, with the libyaml loader and the pure-Python fallback

BILLION_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)


def nested(depth: int) -> str:
    return MINIMAL + "  extra: " + "[" * depth + "]" * depth + "\n"


def t(text: str | bytes, field: str, phrase: str, id: str) -> Any:
    return pytest.param(text, field, phrase, id=id)


# fmt: off
LOADER_RULES = [
    t("x" * (300 * 1024), "manifest", f"is 307200 characters, over the limit of {MAX_MANIFEST_BYTES} bytes", "300-kib-text"),
    t(b"#" * (300 * 1024), "manifest", f"is 307200 bytes, over the limit of {MAX_MANIFEST_BYTES}", "300-kib-bytes"),
    t("# é\n" * 60_000, "manifest", f"is 300000 bytes, over the limit of {MAX_MANIFEST_BYTES}", "multibyte-text-over-limit"),
    t("a: [" + "1," * 60_000 + "1]\n", "manifest", f"holds more than {MAX_VALUES} keys and values", "too-many-values"),
    t(nested(MAX_DEPTH + 10), "manifest", f"nests deeper than {MAX_DEPTH} levels at line 8", "deep-nesting"),
    t("[" * 100_000, "manifest", f"nests deeper than {MAX_DEPTH} levels", "very-deep-unclosed-nesting"),
    t(BILLION_LAUGHS, "a", "anchors and aliases are not allowed, found &a at line 1", "billion-laughs"),
    t(MINIMAL.replace("metadata: {name: tiny}", "metadata: {name: *n}"), "metadata.name", "found *n", "alias"),
    t(MINIMAL.replace("{name: tiny}", "&m {name: tiny}"), "metadata", "found &m", "anchor"),
    t(MINIMAL + "spec: {}\n", "spec", "duplicate key (first at line 4, again at line 8, column 1)", "duplicate-top-level-key"),
    t(MINIMAL.replace("replicas: 2,", "replicas: 2, replicas: 3,"), "spec.tasks[0].replicas", "YAML would silently keep only the last", "duplicate-nested-key"),
    t(MINIMAL.replace("{name: tiny}", "{name: tiny, labels: {a: '1', a: '2'}}"), 'metadata.labels["a"]', "duplicate key", "duplicate-label"),
    t(MINIMAL + "---\n" + MINIMAL, "manifest", "must be a single YAML document, found another at line 8", "two-documents"),
    t("---\n...\n---\n", "manifest", "single YAML document", "two-empty-documents"),
    t(MINIMAL.replace("{name: tiny}", "{name: tiny, labels: {1: one}}"), "metadata.labels", "found '1' at line 3, column 33, which YAML reads as an integer; quote it", "integer-key"),
    t(MINIMAL.replace("{name: tiny}", "{name: tiny, labels: {on: 'x'}}"), "metadata.labels", "which YAML reads as a boolean; quote it", "boolean-key"),
    t(MINIMAL.replace("{name: tiny}", "{name: tiny, labels: {~: x}}"), "metadata.labels", "which YAML reads as null", "null-key"),
    t(MINIMAL.replace("{name: tiny}", "{name: tiny, labels: {[a]: x}}"), "metadata.labels", "found a collection as a key", "collection-key"),
    t(MINIMAL + "<<: {kind: TrainingJob}\n", "manifest", "a merge key, which is not supported", "merge-key"),
    t(MINIMAL.replace("{name: tiny}", "{name: tiny, labels: {!!python/str a: x}}"), "metadata.labels", "tag:yaml.org,2002:python/str", "tagged-key"),
    t("- just\n- a list\n", "manifest", "must be a mapping, got a list", "top-level-list"),
    t("hello", "manifest", "must be a mapping, got 'hello' (a string)", "top-level-scalar"),
    t("", "manifest", "is empty", "empty-text"),
    t("# only a comment\n", "manifest", "is empty", "only-comments"),
    t("apiVersion: gpufed.io/v1\nkind: [TrainingJob\n", "manifest", "is not valid YAML", "unclosed-bracket"),
    t("a: b\n\tc: d\n", "manifest", "at line 2, column 1", "tab-indent"),
    t("a: b: c\n", "manifest", "at line 1, column 5", "syntax-error-line-column"),
    t("a: !!python/object/apply:os.system [ls]\n", "manifest", "could not determine a constructor", "python-tag"),
    t("a: !custom 1\n", "manifest", "could not determine a constructor for the tag '!custom'", "unknown-tag"),
    t("a: !!int abc\n", "manifest", "holds a value YAML cannot build", "bad-explicit-int"),
    t("a: 0x" + "f" * 5000 + "\n", "a", "numbers may have at most 64 characters", "huge-hex-number"),
    t("a: " + ":".join(["1"] * 5000) + "\n", "a", "numbers may have at most 64 characters", "huge-base-60-number"),
    t("a: 1.0e+" + "9" * 100 + "\n", "a", "numbers may have at most 64 characters", "huge-float"),
    t("a: \x07\n", "manifest", "characters are not allowed, found #x0007 at character 3", "control-character"),
    t(b"apiVersion: \xff\xfe\n", "manifest", "is not UTF-8 text: byte 0xff at offset 12", "not-utf8"),
    t("kind: \ud800\n", "manifest", "is not valid Unicode", "lone-surrogate-text"),
    t(MINIMAL.replace("{name: tiny}", "{name: tiny, labels: {team: !!binary aGk=}}"), 'metadata.labels["team"]', "must be a string, got a value of type bytes", "binary-label-value"),
    t(MINIMAL.replace("{name: tiny}", "{name: tiny, labels: !!set {a, b}}"), "metadata.labels", "must be a mapping of strings to strings, got a value of type set", "set-labels"),
    t(MINIMAL + "  deadline: 2026-02-30T12:00:00Z\n", "spec.deadline", "2026-02-30T12:00:00Z': day is out of range", "impossible-unquoted-deadline"),
]
# fmt: on


@pytest.fixture(params=["libyaml", "pure-python"])
def loader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "pure-python":
        monkeypatch.setattr(loader_module, "_Loader", loader_module._PureLoader)
    elif not yaml.__with_libyaml__:
        pytest.skip("PyYAML was built without libyaml")
    return str(request.param)


@pytest.mark.parametrize(("text", "field", "phrase"), LOADER_RULES)
def test_the_loader_refuses_unsafe_or_unreadable_input(
    loader: str, text: str | bytes, field: str, phrase: str
) -> None:
    error = rejection(text)
    assert (error.field, phrase in error.rule) == (field, True), error.rule


def test_the_libyaml_loader_is_used_when_available() -> None:
    if not yaml.__with_libyaml__:
        pytest.skip("PyYAML was built without libyaml")
    assert issubclass(loader_module._Loader, yaml.CSafeLoader)


def test_an_escaped_lone_surrogate_is_refused_by_the_pure_python_loader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # libyaml refuses the escape itself; the pure-Python scanner builds the surrogate, which the scan refuses.
    monkeypatch.setattr(loader_module, "_Loader", loader_module._PureLoader)
    error = rejection(MINIMAL.replace("{name: tiny}", '{name: tiny, annotations: {a: "\\ud800"}}'))
    assert error.field == 'metadata.annotations["a"]'
    assert "lone surrogate" in error.rule


def test_a_manifest_of_exactly_the_size_limit_is_read() -> None:
    text = MINIMAL + "#" * (MAX_MANIFEST_BYTES - len(MINIMAL) - 1) + "\n"
    assert len(text.encode()) == MAX_MANIFEST_BYTES
    assert parse(text).name == "tiny"


def test_the_largest_manifest_the_rules_allow_is_read() -> None:
    env = [{"name": f"VAR_{i}", "value": "x"} for i in range(256)]
    task = {"replicas": 64, "image": "i", "command": ["c"] * 256, "env": env, "gpus": 4}
    doc = edited("spec.tasks", [{"name": f"t{i}", **task} for i in range(16)])
    text = json.dumps(doc, separators=(",", ":"))
    assert len(text) <= MAX_MANIFEST_BYTES
    assert parse(text).gpu_count == 4096


def test_nesting_of_exactly_the_depth_limit_is_read_and_then_judged_by_the_rules() -> None:
    # The root mapping, spec, and the list make three levels; 17 more reach the limit exactly.
    error = rejection(nested(MAX_DEPTH - 3))
    assert (error.field, error.rule.startswith("unknown field 'extra'")) == ("spec.extra", True)


# ---- defaults

# fmt: off
DEFAULTS = [
    pytest.param(lambda s: s.tenant, None, id="tenant-left-to-the-server"),
    pytest.param(lambda s: s.priority_class, "normal", id="priority-class-normal"),
    pytest.param(lambda s: s.gpu_type_policy, GpuTypePolicy.ORDERED, id="gpu-type-policy-ordered"),
    pytest.param(lambda s: s.min_available, 2, id="min-available-all-replicas"),
    pytest.param(lambda s: s.max_runtime_s, 86400, id="max-runtime-24h"),
    pytest.param(lambda s: s.allow_spot, False, id="no-spot"),
    pytest.param(lambda s: s.deadline_s, None, id="no-deadline"),
    pytest.param(lambda s: s.dataset, None, id="no-dataset"),
    pytest.param(lambda s: s.restart_policy.on_failure, RestartAction.ABORT_JOB, id="on-failure-abort-job"),
    pytest.param(lambda s: s.restart_policy.on_eviction, RestartAction.RESTART_JOB, id="on-eviction-restart-job"),
    pytest.param(lambda s: s.restart_policy.max_retries, 3, id="max-retries-3"),
    pytest.param(lambda s: s.labels, (), id="no-labels"),
    pytest.param(lambda s: s.annotations, (), id="no-annotations"),
    pytest.param(lambda s: s.tasks[0].command, (), id="no-command"),
    pytest.param(lambda s: s.tasks[0].env, (), id="no-env"),
]
# fmt: on


@pytest.mark.parametrize(("get", "expected"), DEFAULTS)
def test_a_field_left_out_gets_its_default(get: Any, expected: object) -> None:
    assert get(parse(MINIMAL)) == expected


@pytest.mark.parametrize(
    "key",
    [
        "tenant",
        "priorityClassName",
        "gpuTypePolicy",
        "minAvailable",
        "maxRuntime",
        "allowSpot",
        "resumable",
        "deadline",
        "dataset",
        "restartPolicy",
    ],
)
def test_an_optional_field_set_to_null_gets_its_default(key: str) -> None:
    text = MINIMAL.replace("spec:\n", f"spec:\n  {key}:\n")
    assert parse(text) == parse(MINIMAL)


def test_a_partial_restart_policy_keeps_the_other_defaults() -> None:
    spec = parse(dump(edited("spec.restartPolicy", {"maxRetries": 5})))
    assert spec.restart_policy == RestartPolicy(max_retries=5)


# ---- accepted forms

ZERO_DEADLINE = datetime(2026, 12, 1, 12, tzinfo=UTC).timestamp()

# fmt: off
ACCEPTED = [
    pytest.param("spec.maxRuntime", "90s", lambda s: s.max_runtime_s, 90, id="duration-seconds"),
    pytest.param("spec.maxRuntime", "45m", lambda s: s.max_runtime_s, 2700, id="duration-minutes"),
    pytest.param("spec.maxRuntime", "1h30m", lambda s: s.max_runtime_s, 5400, id="duration-hours-minutes"),
    pytest.param("spec.maxRuntime", "2d", lambda s: s.max_runtime_s, 172_800, id="duration-days"),
    pytest.param("spec.maxRuntime", "30d", lambda s: s.max_runtime_s, 2_592_000, id="duration-the-limit"),
    pytest.param("spec.maxRuntime", 3600, lambda s: s.max_runtime_s, 3600, id="duration-integer-seconds"),
    pytest.param("spec.deadline", datetime(2026, 12, 1, 12, tzinfo=UTC), lambda s: s.deadline_s, ZERO_DEADLINE, id="deadline-yaml-timestamp"),
    pytest.param("spec.deadline", "2026-12-01T12:00:00Z", lambda s: s.deadline_s, ZERO_DEADLINE, id="deadline-string-z"),
    pytest.param("spec.deadline", "2026-12-01T14:00:00+02:00", lambda s: s.deadline_s, ZERO_DEADLINE, id="deadline-string-offset"),
    pytest.param("spec.deadline", "2026-12-01t12:00:00.5z", lambda s: s.deadline_s, ZERO_DEADLINE + 0.5, id="deadline-lowercase-fraction"),
    pytest.param("spec.deadline", datetime(2026, 12, 1, 7, tzinfo=timezone(timedelta(hours=-5))), lambda s: s.deadline_s, ZERO_DEADLINE, id="deadline-yaml-offset"),
    pytest.param("spec.dataset", "imagenet", lambda s: s.dataset, DatasetRef("imagenet"), id="dataset-name"),
    pytest.param("spec.dataset", "c4-en@2024-06", lambda s: s.dataset, DatasetRef("c4-en", "2024-06"), id="dataset-name-at-version"),
    pytest.param("spec.dataset", {"name": "c4-en", "version": "2024-06"}, lambda s: s.dataset, DatasetRef("c4-en", "2024-06"), id="dataset-mapping"),
    pytest.param("spec.dataset", {"name": "s3.bucket.imagenet"}, lambda s: s.dataset, DatasetRef("s3.bucket.imagenet"), id="dataset-mapping-no-version"),
    pytest.param("spec.gpuTypePolicy", "Any", lambda s: s.gpu_type_policy, GpuTypePolicy.ANY, id="policy-any"),
    pytest.param("spec.allowSpot", True, lambda s: s.allow_spot, True, id="allow-spot"),
    pytest.param("spec.resumable", True, lambda s: s.resumable, True, id="resumable"),
    pytest.param("spec.minAvailable", 1, lambda s: s.min_available, 1, id="min-available-elastic"),
    pytest.param("spec.tenant", "vision", lambda s: s.tenant, TenantId("vision"), id="tenant"),
    pytest.param("metadata.labels", {"z": "1", "a": "", "gpufed.io/team": "vision"}, lambda s: s.labels, (("a", ""), ("gpufed.io/team", "vision"), ("z", "1")), id="labels-sorted-prefix-empty-value"),
    pytest.param("metadata.annotations", {"b": "any text: at all\n", "a": ""}, lambda s: s.annotations, (("a", ""), ("b", "any text: at all\n")), id="annotations-sorted-any-string"),
    pytest.param("spec.tasks.0.env", {"B": "1", "A": "2"}, lambda s: s.tasks[0].env, (("B", "1"), ("A", "2")), id="env-mapping-keeps-order"),
    pytest.param("spec.tasks.0.env", [{"name": "B", "value": "1"}, {"name": "A", "value": ""}], lambda s: s.tasks[0].env, (("B", "1"), ("A", "")), id="env-list-keeps-order"),
    pytest.param("spec.tasks.0.command", ["python", "", "--lr=0.1"], lambda s: s.tasks[0].command, ("python", "", "--lr=0.1"), id="command-any-strings"),
    pytest.param("spec.tasks.1.gpus", 0, lambda s: s.gpu_count, 8, id="cpu-only-task"),
    pytest.param("spec.gpuTypes", ["A100-80GB", "h100_sxm", "L4"], lambda s: s.gpu_types, (GpuType("A100-80GB"), GpuType("h100_sxm"), GpuType("L4")), id="gpu-type-names"),
]
# fmt: on


@pytest.mark.parametrize(("path", "value", "get", "expected"), ACCEPTED)
def test_an_accepted_form_gives_the_expected_value(
    path: str, value: object, get: Any, expected: object
) -> None:
    assert get(parse(dump(edited(path, value)))) == expected


def test_a_full_manifest_gives_the_whole_spec() -> None:
    text = dump(edited("spec.restartPolicy", {"onFailure": "RestartJob", "maxRetries": 1}))
    assert parse(text) == TrainingJobSpec(
        name="resnet50",
        tenant=TenantId("vision"),
        priority_class="normal",
        tasks=(
            TaskSpec("master", 1, "pytorch/pytorch:2.3", ("python", "train.py"), (("EPOCHS", "10"),), 8),
            TaskSpec("worker", 4, "pytorch/pytorch:2.3", (), (), 8),
        ),
        gpu_types=(GpuType("H100"), GpuType("A100")),
        gpu_type_policy=GpuTypePolicy.ORDERED,
        min_available=5,
        max_runtime_s=86400,
        restart_policy=RestartPolicy(on_failure=RestartAction.RESTART_JOB, max_retries=1),
        labels=(("team", "vision"),),
        annotations=(("sim.gpufed.io/duration", "4s"),),
    )


@pytest.mark.parametrize(
    "as_input",
    [
        pytest.param(lambda doc: dump(doc), id="yaml-text"),
        pytest.param(lambda doc: dump(doc).encode(), id="utf8-bytes"),
        pytest.param(lambda doc: "\ufeff" + dump(doc), id="text-with-bom"),
        pytest.param(lambda doc: b"\xef\xbb\xbf" + dump(doc).encode(), id="bytes-with-bom"),
        pytest.param(lambda doc: json.dumps(doc), id="json-text"),
        pytest.param(lambda doc: json.dumps(doc, indent=2).encode(), id="json-bytes"),
    ],
)
def test_text_bytes_and_json_give_the_same_spec(as_input: Any) -> None:
    assert parse(as_input(a_manifest())) == parse(dump(a_manifest()))


# ---- examples, rendering and digests

EXAMPLE_MANIFESTS = sorted(
    path
    for path in EXAMPLES.glob("*.yaml")
    # federation.yaml is the embedded default's federation config, not a job manifest.
    if not path.name.startswith("invalid-") and path.name != "federation.yaml"
)


def test_the_example_manifests_are_all_found() -> None:
    assert {p.name for p in EXAMPLE_MANIFESTS} >= {
        "resnet-vision.yaml",
        "llm-finetune-nlp.yaml",
        "bert-eval-nlp.yaml",
    }


@pytest.mark.parametrize("path", EXAMPLE_MANIFESTS, ids=lambda path: path.stem)
def test_an_example_parses_and_survives_a_round_trip(path: Path) -> None:
    spec = parse(path.read_text())
    assert parse(render_manifest(spec)) == spec


# fmt: off
EXAMPLE_FACTS = [
    pytest.param("resnet-vision.yaml", ("vision", "normal", ("A100",), GpuTypePolicy.ORDERED, (2, 2, 2), False, "4s"), id="resnet-vision"),
    pytest.param("llm-finetune-nlp.yaml", ("nlp", "high", ("H100", "A100"), GpuTypePolicy.ORDERED, (4, 4, 4, 4), True, "6s"), id="llm-finetune-nlp"),
    pytest.param("bert-eval-nlp.yaml", ("nlp", "low", ("L4", "A100"), GpuTypePolicy.ANY, (1,), False, "3s"), id="bert-eval-nlp"),
]
# fmt: on


@pytest.mark.parametrize(("name", "facts"), EXAMPLE_FACTS)
def test_an_example_asks_for_what_the_demo_expects(name: str, facts: tuple[object, ...]) -> None:
    spec = parse((EXAMPLES / name).read_text())
    duration = spec.annotation("sim.gpufed.io/duration")
    got = (
        spec.tenant,
        spec.priority_class,
        spec.gpu_types,
        spec.gpu_type_policy,
        spec.replica_gpus,
        spec.allow_spot,
    )
    assert (*got, duration) == facts


def test_the_llm_example_names_its_dataset() -> None:
    assert parse((EXAMPLES / "llm-finetune-nlp.yaml").read_text()).dataset == DatasetRef("c4-en", "2024-06")


def test_the_invalid_example_is_refused_on_replicas() -> None:
    error = rejection((EXAMPLES / "invalid-replicas.yaml").read_text())
    assert (error.field, error.rule) == ("spec.tasks[0].replicas", "must be an integer from 1 to 1024, got 0")


def test_the_rendered_manifest_writes_every_default_out() -> None:
    rendered = yaml.safe_load(render_manifest(parse(MINIMAL)))
    assert rendered["spec"] == {
        "priorityClassName": "normal",
        "gpuTypes": ["A100"],
        "gpuTypePolicy": "Ordered",
        "minAvailable": 2,
        "maxRuntime": "1d",
        "allowSpot": False,
        "resumable": False,
        "restartPolicy": {"onFailure": "AbortJob", "onEviction": "RestartJob", "maxRetries": 3},
        "tasks": [{"name": "worker", "replicas": 2, "image": "pytorch/pytorch:2.3", "gpus": 1}],
    }


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(90, "1m30s"), (5400, "1h30m"), (86400, "1d"), (93_784, "1d2h3m4s"), (2_592_000, "30d")],
    ids=lambda value: str(value),
)
def test_max_runtime_is_rendered_as_a_normalised_duration(seconds: int, text: str) -> None:
    spec = parse(dump(edited("spec.maxRuntime", seconds)))
    assert yaml.safe_load(render_manifest(spec))["spec"]["maxRuntime"] == text


def test_a_deadline_is_rendered_in_utc_with_a_z() -> None:
    spec = parse(dump(edited("spec.deadline", "2026-12-01T14:00:00.250+02:00")))
    assert "deadline: '2026-12-01T12:00:00.250000Z'" in render_manifest(spec)


def test_the_digest_ignores_how_a_manifest_was_written() -> None:
    reordered = a_manifest()
    reordered["metadata"]["labels"] = {"b": "2", "a": "1"}
    same = a_manifest()
    same["metadata"]["labels"] = {"a": "1", "b": "2"}
    same["spec"]["gpuTypePolicy"] = "Ordered"
    same["spec"]["maxRuntime"] = "24h"
    digests = {manifest_digest(parse(dump(reordered))), manifest_digest(parse(json.dumps(same)))}
    assert len(digests) == 1
    assert all(len(d) == 64 and set(d) <= set(string.hexdigits.lower()) for d in digests)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        pytest.param("spec.tasks.1.replicas", 5, id="replicas"),
        pytest.param("spec.tasks.0.env", {"EPOCHS": "11"}, id="env-value"),
        pytest.param("spec.gpuTypes", ["A100", "H100"], id="gpu-type-order"),
        pytest.param("spec.tenant", DELETE, id="tenant"),
        pytest.param("metadata.annotations", {}, id="annotations"),
    ],
)
def test_the_digest_changes_when_the_job_does(path: str, value: object) -> None:
    assert manifest_digest(parse(dump(edited(path, value)))) != manifest_digest(parse(dump(a_manifest())))


def test_env_order_is_part_of_the_digest() -> None:
    first = parse(dump(edited("spec.tasks.0.env", {"A": "1", "B": "2"})))
    second = parse(dump(edited("spec.tasks.0.env", {"B": "2", "A": "1"})))
    assert manifest_digest(first) != manifest_digest(second)


# ---- properties

YAML_ALPHABET = st.sampled_from([*"{}[]:,-&*!|>'\"#%@`?~ \n\tab1.0/", "\u00e9", "\x85", "\ufeff"])
VALID_TEXT = render_manifest(parse(dump(a_manifest())))


@PROPERTY
@given(st.one_of(st.text(), st.binary(), st.text(YAML_ALPHABET)))
def test_any_text_or_bytes_give_a_spec_or_invalid_spec(text: str | bytes) -> None:
    with contextlib.suppress(InvalidSpec):
        parse(text)


@PROPERTY
@given(st.data())
def test_a_mangled_valid_manifest_gives_a_spec_or_invalid_spec(data: st.DataObject) -> None:
    text = VALID_TEXT
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(text)))
        cut = data.draw(st.integers(0, 3))
        text = text[:at] + data.draw(st.text(YAML_ALPHABET, max_size=4)) + text[at + cut :]
    try:
        spec = parse(text)
    except InvalidSpec:
        return
    assert parse(render_manifest(spec)) == spec


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
KNOWN_PATHS = [
    "apiVersion", "kind", "metadata", "metadata.name", "metadata.labels", "metadata.labels.team",
    "metadata.annotations", "spec", "spec.tenant", "spec.priorityClassName", "spec.gpuTypes", "spec.gpuTypes.0",
    "spec.gpuTypePolicy", "spec.minAvailable", "spec.maxRuntime", "spec.allowSpot", "spec.resumable", "spec.deadline",
    "spec.dataset", "spec.restartPolicy", "spec.restartPolicy.onFailure", "spec.restartPolicy.maxRetries",
    "spec.tasks", "spec.tasks.0", "spec.tasks.1.name", "spec.tasks.1.replicas", "spec.tasks.0.image",
    "spec.tasks.0.command", "spec.tasks.0.command.1", "spec.tasks.0.env", "spec.tasks.0.env.EPOCHS", "spec.tasks.0.gpus",
    "spec.unknownField", "metadata.nmae", "spec.tasks.0.replica",
]  # fmt: skip


@PROPERTY
@given(st.sampled_from(KNOWN_PATHS), JSON_VALUES, st.booleans())
def test_any_value_under_any_key_gives_a_spec_or_invalid_spec(
    path: str, value: object, as_json: bool
) -> None:
    doc = edited(path, value)
    try:
        spec = parse(json.dumps(doc) if as_json else dump(doc))
    except InvalidSpec:
        return
    assert parse(render_manifest(spec)) == spec


LOWER_ALNUM = string.ascii_lowercase + string.digits
ALNUM = string.ascii_letters + string.digits


def joined(edge: str, middle: str) -> st.SearchStrategy[str]:
    """Names like `a`, `a1` or `a-b`: `edge` characters at both ends, one of `middle` between words."""
    word = st.text(edge, min_size=1, max_size=5)
    return word | st.builds(lambda a, sep, b: f"{a}{sep}{b}", word, st.sampled_from(middle), word)


DNS_LABELS = joined(LOWER_ALNUM, "-")
LABEL_PART = joined(ALNUM, "-_.")
LABEL_KEYS = LABEL_PART | st.builds(lambda a, b: f"{a}.io/{b}", DNS_LABELS, LABEL_PART)
ENV_NAMES = st.builds(
    operator.add, st.sampled_from(string.ascii_letters + "_"), st.text(ALNUM + "_", max_size=6)
)
GPU_TYPES = joined(ALNUM, "-_.").map(GpuType)
IMAGES = st.text(LOWER_ALNUM + "./:_-", min_size=1, max_size=30)
# Free text: any character but the control (tab and newlines aside) and bidirectional ones, which
# the parser refuses (see test_control_and_bidi_characters_are_refused_in_free_text).
FREE_TEXT = st.text(
    st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters=sorted(BIDI))
    | st.sampled_from("\t\n\r"),
    max_size=30,
)


@st.composite
def task_specs(draw: st.DrawFn, name: str) -> TaskSpec:
    env = draw(st.dictionaries(ENV_NAMES, FREE_TEXT, max_size=3))
    return TaskSpec(
        name=name,
        replicas=draw(st.integers(1, 8)),
        image=draw(IMAGES),
        command=tuple(draw(st.lists(FREE_TEXT, max_size=4))),
        env=tuple(env.items()),
        gpus_per_replica=draw(st.integers(1, 16)),
    )


@st.composite
def job_specs(draw: st.DrawFn) -> TrainingJobSpec:
    names = draw(st.lists(DNS_LABELS, min_size=1, max_size=3, unique=True))
    tasks = tuple(draw(task_specs(name)) for name in names)
    deadline = draw(st.none() | st.datetimes(min_value=datetime(1970, 1, 1), timezones=st.just(UTC)))
    dataset = draw(
        st.none()
        | st.builds(DatasetRef, DNS_LABELS, st.none() | st.text(ALNUM + "._-", min_size=1, max_size=12))
    )
    return TrainingJobSpec(
        name=draw(DNS_LABELS),
        tenant=draw(st.none() | DNS_LABELS.map(TenantId)),
        priority_class=draw(st.sampled_from(sorted(CLASSES))),
        tasks=tasks,
        gpu_types=tuple(draw(st.lists(GPU_TYPES, min_size=1, max_size=8, unique=True))),
        gpu_type_policy=draw(st.sampled_from(GpuTypePolicy)),
        min_available=draw(st.integers(1, sum(t.replicas for t in tasks))),
        max_runtime_s=draw(st.integers(1, 30 * 86400)),
        restart_policy=RestartPolicy(
            draw(st.sampled_from(RestartAction)),
            draw(st.sampled_from(RestartAction)),
            draw(st.integers(0, 100)),
        ),
        allow_spot=draw(st.booleans()),
        dataset=dataset,
        deadline_s=None if deadline is None else deadline.timestamp(),
        labels=tuple(sorted(draw(st.dictionaries(LABEL_KEYS, LABEL_PART | st.just(""), max_size=4)).items())),
        annotations=tuple(sorted(draw(st.dictionaries(LABEL_KEYS, FREE_TEXT, max_size=4)).items())),
    )


@PROPERTY
@given(job_specs())
def test_a_valid_spec_survives_render_and_parse(spec: TrainingJobSpec) -> None:
    again = parse(render_manifest(spec))
    assert again == spec
    assert manifest_digest(again) == manifest_digest(spec)


@pytest.mark.parametrize("bad", ["\x00", "\x1b[2J", "\u202e", "\u2066", "\x7f", "\x85"])
@pytest.mark.parametrize(
    ("where", "field"),
    [
        ("env", 'spec.tasks[0].env["TOKEN"]'),
        ("command", "spec.tasks[0].command[1]"),
        ("annotation", 'metadata.annotations["team.io/note"]'),
    ],
)
def test_control_and_bidi_characters_are_refused_in_free_text(bad: str, where: str, field: str) -> None:
    """NUL, ESC, DEL, C1 controls and bidi overrides would hide or disguise text in a terminal, a log
    or a pod spec (Trojan Source); tab and newlines are ordinary in scripts and certificates."""

    def manifest(text: str) -> str:
        return json.dumps(
            {
                "apiVersion": "gpufed.io/v1",
                "kind": "TrainingJob",
                "metadata": {
                    "name": "t",
                    "annotations": {"team.io/note": text if where == "annotation" else "x"},
                },
                "spec": {
                    "gpuTypes": ["A100"],
                    "tasks": [
                        {
                            "name": "w",
                            "replicas": 1,
                            "image": "img",
                            "gpus": 1,
                            "command": ["sh", text if where == "command" else "x"],
                            "env": {"TOKEN": text if where == "env" else "x"},
                        }
                    ],
                },
            }
        )

    with pytest.raises(InvalidSpec) as error:
        parse(manifest(f"ok{bad}ok"))
    assert error.value.field == field
    assert f"U+{ord(bad[0]):04X} at character 2" in str(error.value)
    parse(manifest("a\tb\nc\r\nd"))
