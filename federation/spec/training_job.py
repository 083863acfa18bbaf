"""Parse and validate `TrainingJob` manifests: the one door from user YAML to a `TrainingJobSpec`.

Loading untrusted text is `federation.spec.manifest_text`'s job; this module applies the field rules.
Every rejection, for any input at all, is an `InvalidSpec` naming the field path
(`spec.tasks[1].replicas`) and the rule, so the API can answer with a clear INVALID_ARGUMENT.

`render_manifest` writes the canonical form back (every default explicit) and `manifest_digest`
hashes it, so that an idempotency key reused with a different job can be told apart.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Collection, Sequence
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any, TypeVar

import yaml

from federation.errors import InvalidSpec
from federation.spec.gpu_request import min_gpu_memory_gib, pinning, placement_document
from federation.spec.jobspec import (
    API_VERSION,
    KIND,
    DatasetRef,
    OutputSpec,
    RestartAction,
    RestartPolicy,
    TaskSpec,
    TrainingJobSpec,
)
from federation.spec.manifest_text import (
    MAX_MANIFEST_BYTES,
    field_path,
    key_path,
    load_manifest_text,
    shorten,
)
from federation.spec.pod_template import owned_env_name, parse_template, template_text
from federation.spec.priorities import DEFAULT_PRIORITY_CLASS
from federation.spec.quantity import RULE as QUANTITY_RULE
from federation.spec.quantity import parse_quantity
from federation.spec.secret_refs import with_secret_env
from federation.spec.validate import free_text
from placement.model import GpuType, GpuTypePolicy, TenantId

MAX_TASKS = 16
MAX_REPLICAS = 1024  # per task and across the job
MAX_GPUS_PER_REPLICA = 16
MAX_JOB_GPUS = 4096
MAX_GPU_TYPES = 8
MAX_LABELS = 64
MAX_ANNOTATIONS_BYTES = 64 * 1024
MAX_ENV = 256
MAX_COMMAND_ITEMS = 256
MAX_COMMAND_ITEM_CHARS = 4096
MAX_IMAGE_CHARS = 512
MAX_RETRIES = 100
MAX_RUNTIME_S = 30 * 86400
MAX_OUTPUTS = 16
MAX_OUTPUT_PATH_CHARS = 512
DEFAULT_MAX_RUNTIME_S = 86400

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# A dataset another tenant shared is named `tenant/name`; a bare name is the job's tenant's own.
_DATASET_REF = re.compile(r"([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/)?[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_GPU_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,31}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VERSION = re.compile(r"[A-Za-z0-9._-]{1,64}")
# Nine digits per unit keeps int() far from Python's digit limit; 30 days fits easily.
_DURATION = re.compile(r"(?:(\d{1,9})d)?(?:(\d{1,9})h)?(?:(\d{1,9})m)?(?:(\d{1,9})s)?")
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,32}))?(?:([Zz])|([+-])(\d{2}):(\d{2}))"
)

_DNS_LABEL_RULE = (
    "a DNS-1123 label (lowercase letters, digits and '-', starting and ending with a letter or digit, "
    "at most 63 characters)"
)
_DURATION_RULE = "a duration like '90s', '45m', '1h30m' or '2d', or whole seconds"
_TOP_KEYS = ("apiVersion", "kind", "metadata", "spec")
_METADATA_KEYS = ("name", "labels", "annotations")
_SPEC_KEYS = (
    "tenant",
    "priorityClassName",
    "gpuTypes",
    "gpuTypePolicy",
    "minGpuMemoryGiB",
    "placement",
    "minAvailable",
    "maxRuntime",
    "allowSpot",
    "resumable",
    "deadline",
    "maxWait",
    "dataset",
    "outputs",
    "restartPolicy",
    "tasks",
)
_TASK_KEYS = ("name", "replicas", "image", "command", "env", "gpus", "shmSize", "template", "secretEnv")
_POLICIES = {"Ordered": GpuTypePolicy.ORDERED, "Any": GpuTypePolicy.ANY}
_POLICY_NAMES = {policy: name for name, policy in _POLICIES.items()}
_ACTIONS = {action.value: action for action in RestartAction}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LAST_DEADLINE_S = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
_T = TypeVar("_T")


# ---- field rules: each names its field in the error


def _found(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return f"{shorten(value)} (a string)"
    if isinstance(value, date):
        return f"a {'timestamp' if isinstance(value, datetime) else 'date'} ({value.isoformat()})"
    if isinstance(value, dict | list):
        return "a mapping" if isinstance(value, dict) else "a list"
    return f"a value of type {type(value).__name__}"


def _did_you_mean(word: str, choices: Collection[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _mapping(
    value: object, path: str, allowed: Sequence[str], required: Sequence[str] = ()
) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidSpec(field_path(path), f"must be a mapping, got {_found(value)}")
    for key in value:
        if key not in allowed:
            name = str(key)
            hint = _did_you_mean(name, allowed) or f"; expected one of: {', '.join(allowed)}"
            raise InvalidSpec(key_path(path, name), f"unknown field {shorten(name)}{hint}")
    for key in required:
        if key not in value:
            raise InvalidSpec(key_path(path, key), "is required")
    return value


def _user_map(value: object, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidSpec(path, f"must be a mapping of strings to strings, got {_found(value)}")
    return value


def _string(value: object, path: str) -> str:
    if not isinstance(value, str):
        hint = "; quote it" if isinstance(value, int | float | date) or value is None else ""
        raise InvalidSpec(path, f"must be a string, got {_found(value)}{hint}")
    return value


def _free_text(value: object, path: str) -> str:
    """A string a user writes freely (env values, command items, annotations), without the control
    and bidirectional characters that would hide or disguise text in a terminal, a log or a pod spec."""
    return free_text(_string(value, path), path)


def _matching(value: object, path: str, pattern: re.Pattern[str], max_chars: int, rule: str) -> str:
    text = _string(value, path)
    if len(text) > max_chars or not pattern.fullmatch(text):
        raise InvalidSpec(path, f"must be {rule}, got {shorten(text)}")
    return text


def _dns_label(value: object, path: str) -> str:
    return _matching(value, path, _DNS_LABEL, 63, _DNS_LABEL_RULE)


def _integer(value: object, path: str, low: int, high: int, what: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidSpec(path, f"must be an integer from {low} to {high}{what}, got {_found(value)}")
    return value


def _list(value: object, path: str, low: int, high: int) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidSpec(path, f"must be a list, got {_found(value)}")
    if not low <= len(value) <= high:
        raise InvalidSpec(path, f"must have from {low} to {high} items, got {len(value)}")
    return value


def _choice(value: object, path: str, choices: dict[str, _T], default: _T) -> _T:
    if value is None:
        return default
    if isinstance(value, str) and value in choices:
        return choices[value]
    hint = _did_you_mean(value, choices) if isinstance(value, str) else ""
    raise InvalidSpec(path, f"must be one of {', '.join(choices)}, got {_found(value)}{hint}")


def _label_key(key: str, path: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        raise InvalidSpec(
            path,
            "key prefix must be a DNS subdomain (lowercase letters, digits, '-' and '.', at most 253 "
            f"characters) followed by '/', got {shorten(prefix)}",
        )
    if len(name) > 63 or not _LABEL_NAME.fullmatch(name):
        raise InvalidSpec(
            path,
            "key name must be 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter "
            f"or digit, got {shorten(name)}",
        )


def _labels(value: object, path: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    labels = _user_map(value, path)
    if len(labels) > MAX_LABELS:
        raise InvalidSpec(path, f"must have at most {MAX_LABELS} entries, got {len(labels)}")
    for key, item in labels.items():
        at = key_path(path, key)
        _label_key(key, at)
        text = _string(item, at)
        if text and (len(text) > 63 or not _LABEL_NAME.fullmatch(text)):
            raise InvalidSpec(
                at,
                "value must be empty or 1 to 63 letters, digits, '-', '_' or '.', starting and ending "
                f"with a letter or digit, got {shorten(text)}",
            )
    return tuple(sorted(labels.items()))


def _annotations(value: object, path: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    annotations = _user_map(value, path)
    for key, item in annotations.items():
        at = key_path(path, key)
        _label_key(key, at)
        _free_text(item, at)
    size = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
    if size > MAX_ANNOTATIONS_BYTES:
        raise InvalidSpec(
            path, f"keys and values must total at most {MAX_ANNOTATIONS_BYTES} bytes, got {size} bytes"
        )
    return tuple(sorted(annotations.items()))


def _env(value: object, path: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict | list):
        raise InvalidSpec(
            path, f"must be a mapping of names to strings or a list of {{name, value}}, got {_found(value)}"
        )
    if len(value) > MAX_ENV:
        raise InvalidSpec(path, f"must have at most {MAX_ENV} variables, got {len(value)}")
    if isinstance(value, dict):
        entries = [(name, item, key_path(path, name), key_path(path, name)) for name, item in value.items()]
    else:
        entries = []
        for i, raw in enumerate(value):
            item = _mapping(raw, f"{path}[{i}]", ("name", "value"), required=("name", "value"))
            entries.append((item["name"], item["value"], f"{path}[{i}].name", f"{path}[{i}].value"))
    seen: dict[str, str] = {}
    for name, item, name_at, value_at in entries:
        text = _matching(
            name, name_at, _ENV_NAME, MAX_MANIFEST_BYTES, "a variable name ([A-Za-z_][A-Za-z0-9_]*)"
        )
        if text in seen:
            raise InvalidSpec(name_at, f"duplicate variable {shorten(text)} (also at {seen[text]})")
        seen[text] = name_at
        _free_text(item, value_at)
    return tuple((name, item) for name, item, _, _ in entries)


def _command(value: object, path: str) -> tuple[str, ...]:
    if value is None:
        return ()
    items = _list(value, path, 0, MAX_COMMAND_ITEMS)
    for i, item in enumerate(items):
        if len(_free_text(item, f"{path}[{i}]")) > MAX_COMMAND_ITEM_CHARS:
            raise InvalidSpec(
                f"{path}[{i}]", f"must have at most {MAX_COMMAND_ITEM_CHARS} characters, got {len(item)}"
            )
    return tuple(items)


def _image(value: object, path: str) -> str:
    text = _string(value, path)
    # `split()` breaks at exactly what `isspace` calls whitespace: a one-piece split equal to the
    # text has none (a generator over the characters cost more than the rest of the task's checks).
    if not text or len(text) > MAX_IMAGE_CHARS or not text.isprintable() or text.split() != [text]:
        raise InvalidSpec(
            path,
            f"must be a container image reference: 1 to {MAX_IMAGE_CHARS} characters without whitespace, "
            f"got {shorten(text)}",
        )
    return text


def _shm_size(value: object, path: str) -> str | None:
    if value is None:
        return None
    amount = parse_quantity(value)
    if amount is None or isinstance(value, float):
        raise InvalidSpec(path, f"must be {QUANTITY_RULE}, got {_found(value)}")
    if amount <= 0:
        raise InvalidSpec(path, f"must be more than 0, got {_found(value)}")
    return str(value)


def _task(raw: object, at: str) -> TaskSpec:
    """One task: its short fields, and its pod template where it has one (the two agree or it is refused)."""
    task = _mapping(raw, at, _TASK_KEYS, required=("name", "replicas", "gpus"))
    name = _dns_label(task["name"], f"{at}.name")
    env = _env(task.get("env"), f"{at}.env")
    for i, (variable, _) in enumerate(env):
        if owned_env_name(variable):
            where = (
                key_path(f"{at}.env", variable) if isinstance(task["env"], dict) else f"{at}.env[{i}].name"
            )
            raise InvalidSpec(where, f"{variable} is set by gpufed, which owns the rendezvous environment")
    shm_size = _shm_size(task.get("shmSize"), f"{at}.shmSize")
    template: dict[str, Any] | None = None
    image: object = task.get("image")
    command: object = task.get("command")
    if task.get("template") is not None:
        template, template_image, template_command = parse_template(
            task["template"], f"{at}.template", task=name, shm_size=shm_size, short_env=env
        )
        main = f"{at}.template.spec.containers[0]"
        if template_image is not None:
            if image is not None:
                raise InvalidSpec(f"{main}.image", f"set the image once: {at}.image gives it already")
            image = template_image
        if template_command is not None:
            if command is not None:
                raise InvalidSpec(f"{main}.command", f"set the command once: {at}.command gives it already")
            command = list(template_command)
    if image is None:
        raise InvalidSpec(f"{at}.image", "is required (here, or in template.spec.containers[0].image)")
    # Secret variables go into the template as secretKeyRefs (federation.spec.secret_refs).
    template = with_secret_env(template, task.get("secretEnv"), f"{at}.secretEnv", task=name, short_env=env)
    return TaskSpec(
        name=name,
        replicas=_integer(task["replicas"], f"{at}.replicas", 1, MAX_REPLICAS),
        image=_image(image, f"{at}.image"),
        command=_command(command, f"{at}.command"),
        env=env,
        gpus_per_replica=_integer(task["gpus"], f"{at}.gpus", 0, MAX_GPUS_PER_REPLICA),
        template="" if template is None else template_text(template),
        shm_size=shm_size or "",
    )


def _tasks(value: object, path: str) -> tuple[TaskSpec, ...]:
    tasks: list[TaskSpec] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(_list(value, path, 1, MAX_TASKS)):
        at = f"{path}[{i}]"
        task = _task(raw, at)
        if task.name in seen:
            raise InvalidSpec(
                f"{at}.name", f"duplicate task name {task.name!r} (also {path}[{seen[task.name]}])"
            )
        seen[task.name] = i
        tasks.append(task)
    replicas = sum(t.replicas for t in tasks)
    if replicas > MAX_REPLICAS:
        raise InvalidSpec(path, f"total replicas across tasks must be at most {MAX_REPLICAS}, got {replicas}")
    gpus = sum(t.replicas * t.gpus_per_replica for t in tasks)
    if not 1 <= gpus <= MAX_JOB_GPUS:
        raise InvalidSpec(
            path, f"must ask for 1 to {MAX_JOB_GPUS} GPUs in all (replicas x gpus, summed), got {gpus}"
        )
    return tuple(tasks)


def _gpu_types(value: object, path: str, at_least: int = 1) -> tuple[GpuType, ...]:
    seen: dict[str, int] = {}
    for i, item in enumerate(_list(value, path, at_least, MAX_GPU_TYPES)):
        name = _matching(
            item, f"{path}[{i}]", _GPU_TYPE, 32, "a GPU type name like 'H100' or 'A100-80GB' ([A-Za-z0-9._-])"
        )
        if name in seen:
            raise InvalidSpec(f"{path}[{i}]", f"duplicate GPU type {name!r} (also {path}[{seen[name]}])")
        seen[name] = i
    return tuple(GpuType(name) for name in seen)


def _priority_class(value: object, path: str, classes: Collection[str]) -> str:
    listed = ", ".join(sorted(classes)) or "(none configured)"
    if value is None:
        if DEFAULT_PRIORITY_CLASS not in classes:
            raise InvalidSpec(
                path, f"is required here: the default {DEFAULT_PRIORITY_CLASS!r} is not configured ({listed})"
            )
        return DEFAULT_PRIORITY_CLASS
    name = _string(value, path)
    if name not in classes:
        raise InvalidSpec(path, f"must be one of {listed}, got {shorten(name)}{_did_you_mean(name, classes)}")
    return name


def duration_seconds(text: str, path: str) -> int:
    """A duration as manifests write it ('72h', '1h30m', '2d'), at most 30 days; errors name `path`."""
    return _duration_s(text if text else "", path)


def _duration_s(value: object, path: str) -> int:
    if value is None:
        return DEFAULT_MAX_RUNTIME_S
    if isinstance(value, int) and not isinstance(value, bool):
        seconds = value
    elif isinstance(value, str) and value and (match := _DURATION.fullmatch(value)):
        days, hours, minutes, secs = (int(part or 0) for part in match.groups())
        seconds = ((days * 24 + hours) * 60 + minutes) * 60 + secs
    else:
        raise InvalidSpec(path, f"must be {_DURATION_RULE}, got {_found(value)}")
    if not 0 < seconds <= MAX_RUNTIME_S:
        raise InvalidSpec(
            path, f"must be more than 0 and at most 30d ({MAX_RUNTIME_S} seconds), got {seconds} seconds"
        )
    return seconds


def _format_duration(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = zip((days, hours, minutes, secs), "dhms", strict=True)
    return "".join(f"{n}{unit}" for n, unit in parts if n) or "0s"


def _deadline_s(value: object, path: str) -> float | None:
    rule = "must be an RFC 3339 timestamp with a timezone, like 2026-12-01T12:00:00Z"
    if value is None:
        return None
    if isinstance(value, str):
        match = _RFC3339.fullmatch(value)
        if match is None:
            raise InvalidSpec(path, f"{rule}, got {shorten(value)}")
        year, month, day, hour, minute, second = (int(part) for part in match.groups()[:6])
        fraction, utc, sign, offset_h, offset_m = match.groups()[6:]
        offset = timedelta(0) if utc else timedelta(hours=int(offset_h), minutes=int(offset_m))
        try:
            zone = timezone(-offset if sign == "-" else offset)
            micros = int((fraction or "0").ljust(6, "0")[:6])
            value = datetime(year, month, day, hour, minute, second, micros, tzinfo=zone)
        except ValueError as error:
            raise InvalidSpec(path, f"{rule}, got {shorten(match[0])}: {error}") from None
    if not isinstance(value, datetime):
        raise InvalidSpec(path, f"{rule}, got {_found(value)}")
    if value.utcoffset() is None:
        raise InvalidSpec(path, f"{rule}, got {value.isoformat()} without a timezone")
    seconds = (value - _EPOCH).total_seconds()
    if not 0 <= seconds <= _LAST_DEADLINE_S:
        raise InvalidSpec(
            path, f"must be between 1970-01-01T00:00:00Z and 9999-12-31T23:59:59Z, got {value.isoformat()}"
        )
    return seconds


def _max_wait_s(value: object, path: str) -> int | None:
    """`spec.maxWait`: a duration as `maxRuntime`, or 0 for a job that never waits for private GPUs."""
    if value is None:
        return None
    if (value == 0 and not isinstance(value, bool)) or value == "0s":
        return 0
    return _duration_s(value, path)


def _format_deadline(seconds: float) -> str:
    moment = _EPOCH + timedelta(seconds=seconds)
    return moment.replace(tzinfo=None).isoformat() + "Z"


def _dataset(value: object, path: str) -> DatasetRef | None:
    name_rule = (
        "a dataset name (lowercase letters, digits, '-' and '.', at most 253 characters), "
        "optionally after 'tenant/' for a dataset another tenant shared"
    )
    version_rule = "a version of 1 to 64 letters, digits, '.', '_' or '-'"
    if value is None:
        return None
    if isinstance(value, str):
        name, at, version = value.partition("@")
        if not (len(name) <= 317 and _DATASET_REF.fullmatch(name)) or (
            at and not _VERSION.fullmatch(version)
        ):
            raise InvalidSpec(
                path,
                f"must be 'name' or 'name@version', with {name_rule} and {version_rule}, "
                f"got {shorten(value)}",
            )
        return DatasetRef(name, version if at else None)
    if not isinstance(value, dict):
        raise InvalidSpec(path, f"must be 'name', 'name@version' or {{name, version}}, got {_found(value)}")
    ref = _mapping(value, path, ("name", "version"), required=("name",))
    name = _matching(ref["name"], f"{path}.name", _DATASET_REF, 317, name_rule)
    if ref.get("version") is None:
        return DatasetRef(name)
    return DatasetRef(name, _matching(ref["version"], f"{path}.version", _VERSION, 64, version_rule))


_BARE_DATASET = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
# Where gpufed keeps copies and datasync's state in every store: never a job's output.
_RESERVED_ROOTS = ("gpufed-cache", ".gpufed")


def _output_path(value: object, path: str) -> str:
    """An object prefix, relative, ending in '/': no empty, '.' or '..' parts, no control characters."""
    text = _string(value, path)
    rule = (
        f"must be a relative object prefix such as 'vision/tokens/' (1 to {MAX_OUTPUT_PATH_CHARS} "
        "characters, no leading '/', no empty, '.' or '..' parts, no control characters)"
    )
    if not text or len(text) > MAX_OUTPUT_PATH_CHARS:
        raise InvalidSpec(path, f"{rule}, got {shorten(text)}")
    text = text if text.endswith("/") else text + "/"
    parts = text[:-1].split("/")
    if text.startswith("/") or any(p in ("", ".", "..") for p in parts) or not text.isprintable():
        raise InvalidSpec(path, f"{rule}, got {shorten(text)}")
    if parts[0] in _RESERVED_ROOTS:
        raise InvalidSpec(path, f"{parts[0]}/ is reserved for gpufed's copies and state, got {shorten(text)}")
    return text


def _outputs(value: object, path: str) -> tuple[OutputSpec, ...]:
    """`spec.outputs`: each a dataset of the job's own tenant, on a prefix no other output overlaps."""
    if value is None:
        return ()
    outputs: list[OutputSpec] = []
    for i, raw in enumerate(_list(value, path, 1, MAX_OUTPUTS)):
        at = f"{path}[{i}]"
        item = _mapping(raw, at, ("dataset", "path", "version"), required=("dataset", "path"))
        name = _string(item["dataset"], f"{at}.dataset")
        if "/" in name:
            raise InvalidSpec(
                f"{at}.dataset",
                "must be a dataset of the job's own tenant (a bare name): a job cannot write into "
                f"another tenant's dataset, got {shorten(name)}",
            )
        if len(name) > 253 or not _BARE_DATASET.fullmatch(name):
            raise InvalidSpec(
                f"{at}.dataset",
                f"must be a dataset name (lowercase letters, digits, '-' and '.'), got {shorten(name)}",
            )
        version = item.get("version")
        if version is not None:
            version = _matching(
                version, f"{at}.version", re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"), 64,
                "1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit",
            )  # fmt: skip
        prefix = _output_path(item["path"], f"{at}.path")
        for j, other in enumerate(outputs):
            if other.dataset == name:
                raise InvalidSpec(f"{at}.dataset", f"dataset {name!r} is already {path}[{j}]'s output")
            if prefix.startswith(other.path) or other.path.startswith(prefix):
                raise InvalidSpec(
                    f"{at}.path",
                    f"{shorten(prefix)} overlaps {path}[{j}].path {shorten(other.path)}: "
                    "each output needs a prefix of its own",
                )
        outputs.append(OutputSpec(name, prefix, version))
    return tuple(outputs)


def _restart_policy(value: object, path: str) -> RestartPolicy:
    if value is None:
        return RestartPolicy()
    policy = _mapping(value, path, ("onFailure", "onEviction", "maxRetries"))
    default = RestartPolicy()
    retries = policy.get("maxRetries")
    return RestartPolicy(
        on_failure=_choice(policy.get("onFailure"), f"{path}.onFailure", _ACTIONS, default.on_failure),
        on_eviction=_choice(policy.get("onEviction"), f"{path}.onEviction", _ACTIONS, default.on_eviction),
        max_retries=default.max_retries
        if retries is None
        else _integer(retries, f"{path}.maxRetries", 0, MAX_RETRIES),
    )


def _boolean(value: object, path: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidSpec(path, f"must be true or false (a YAML boolean, not a string), got {_found(value)}")
    return value


# ---- the manifest


def parse_manifest(text: str | bytes, *, priority_classes: Collection[str]) -> TrainingJobSpec:
    """The validated spec of a manifest; otherwise InvalidSpec naming the first field that breaks a rule."""
    doc = load_manifest_text(text)
    if doc is None:
        raise InvalidSpec(
            "manifest", "is empty: expected a TrainingJob with apiVersion, kind, metadata and spec"
        )
    root = _mapping(doc, "", _TOP_KEYS, required=_TOP_KEYS)
    for key, expected in (("apiVersion", API_VERSION), ("kind", KIND)):
        if root[key] != expected:
            raise InvalidSpec(key, f"must be {expected!r}, got {_found(root[key])}")
    metadata = _mapping(root["metadata"], "metadata", _METADATA_KEYS, required=("name",))
    name = _dns_label(metadata["name"], "metadata.name")
    labels = _labels(metadata.get("labels"), "metadata.labels")
    annotations = _annotations(metadata.get("annotations"), "metadata.annotations")

    spec = _mapping(root["spec"], "spec", _SPEC_KEYS, required=("tasks",))
    memory = min_gpu_memory_gib(spec.get("minGpuMemoryGiB"), "spec.minGpuMemoryGiB")
    if "gpuTypes" not in spec and not memory:
        raise InvalidSpec(
            "spec.gpuTypes", "is required (or spec.minGpuMemoryGiB, for any type with that memory)"
        )
    tenant = spec.get("tenant")
    priority_class = _priority_class(
        spec.get("priorityClassName"), "spec.priorityClassName", priority_classes
    )
    gpu_types = _gpu_types(spec.get("gpuTypes", []), "spec.gpuTypes", 0 if memory else 1)
    policy = _choice(spec.get("gpuTypePolicy"), "spec.gpuTypePolicy", _POLICIES, GpuTypePolicy.ORDERED)
    tasks = _tasks(spec["tasks"], "spec.tasks")
    replicas = sum(t.replicas for t in tasks)
    min_available = spec.get("minAvailable")
    return TrainingJobSpec(
        name=name,
        tenant=None if tenant is None else TenantId(_dns_label(tenant, "spec.tenant")),
        priority_class=priority_class,
        tasks=tasks,
        gpu_types=gpu_types,
        gpu_type_policy=policy,
        min_available=replicas
        if min_available is None
        else _integer(min_available, "spec.minAvailable", 1, replicas, " (the job's total replicas)"),
        max_runtime_s=_duration_s(spec.get("maxRuntime"), "spec.maxRuntime"),
        restart_policy=_restart_policy(spec.get("restartPolicy"), "spec.restartPolicy"),
        allow_spot=_boolean(spec.get("allowSpot"), "spec.allowSpot"),
        resumable=_boolean(spec.get("resumable"), "spec.resumable"),
        dataset=_dataset(spec.get("dataset"), "spec.dataset"),
        outputs=_outputs(spec.get("outputs"), "spec.outputs"),
        deadline_s=_deadline_s(spec.get("deadline"), "spec.deadline"),
        max_wait_s=_max_wait_s(spec.get("maxWait"), "spec.maxWait"),
        labels=labels,
        annotations=annotations,
        min_gpu_memory_gib=memory,
        pinning=pinning(spec.get("placement"), "spec.placement"),
    )


def _canonical(spec: TrainingJobSpec) -> dict[str, Any]:
    """The manifest with every default written out; optional fields that are unset are left out."""
    metadata: dict[str, Any] = {"name": spec.name}
    if spec.labels:
        metadata["labels"] = dict(spec.labels)
    if spec.annotations:
        metadata["annotations"] = dict(spec.annotations)
    body: dict[str, Any] = {} if spec.tenant is None else {"tenant": str(spec.tenant)}
    body["priorityClassName"] = spec.priority_class
    # Only a job that asks for memory alone names no type; the fields added for GPU types (issue 32)
    # are written only when set, so that older jobs keep their canonical form and digest.
    if spec.gpu_types or not spec.min_gpu_memory_gib:
        body["gpuTypes"] = [str(gpu_type) for gpu_type in spec.gpu_types]
    if spec.min_gpu_memory_gib:
        body["minGpuMemoryGiB"] = spec.min_gpu_memory_gib
    if spec.pinning:
        body["placement"] = placement_document(spec.pinning)
    body |= {
        "gpuTypePolicy": _POLICY_NAMES[spec.gpu_type_policy],
        "minAvailable": spec.min_available,
        "maxRuntime": _format_duration(spec.max_runtime_s),
        "allowSpot": spec.allow_spot,
        "resumable": spec.resumable,
    }
    if spec.deadline_s is not None:
        body["deadline"] = _format_deadline(spec.deadline_s)
    if spec.max_wait_s is not None:
        body["maxWait"] = _format_duration(spec.max_wait_s)
    if spec.dataset is not None:
        body["dataset"] = str(spec.dataset)
    if spec.outputs:
        # Written only when set, so that jobs without outputs keep their canonical form and digest.
        body["outputs"] = [
            {"dataset": o.dataset, "path": o.path, **({"version": o.version} if o.version else {})}
            for o in spec.outputs
        ]
    body["restartPolicy"] = {
        "onFailure": spec.restart_policy.on_failure.value,
        "onEviction": spec.restart_policy.on_eviction.value,
        "maxRetries": spec.restart_policy.max_retries,
    }
    body["tasks"] = []
    for task in spec.tasks:
        entry: dict[str, Any] = {"name": task.name, "replicas": task.replicas, "image": task.image}
        if task.command:
            entry["command"] = list(task.command)
        if task.env:
            entry["env"] = dict(task.env)
        entry["gpus"] = task.gpus_per_replica
        if task.shm_size:
            entry["shmSize"] = task.shm_size
        if task.template:
            entry["template"] = json.loads(task.template)
        body["tasks"].append(entry)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": body}


class _Dumper(yaml.SafeDumper):
    """The pure-Python emitter, so the canonical text is the same with or without libyaml."""

    def ignore_aliases(self, data: Any) -> bool:
        return True  # a manifest with anchors would be refused by parse_manifest


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    # PyYAML writes NEL and the Unicode line separators raw in single quotes, where a reader folds
    # them into spaces; in double quotes they are escaped and survive the round trip.
    style = '"' if any(c in text for c in "\x85\u2028\u2029") else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _represent_str)


# Rendered manifests by the spec object they were rendered from (frozen, so its text never changes);
# the object is kept beside its text, so its id cannot pass to another object while it is cached.
# PyYAML's emitter is pure Python: every GetJob rendered its job's manifest anew, 2.4 of the 3.8 ms
# of CPU the server spent on a GetJob (py-spy), and a job's spec object lives as long as its job
# does in the cache, across its transitions.
_RENDERED_MAX = 4096
_rendered: OrderedDict[int, tuple[TrainingJobSpec, str]] = OrderedDict()
_rendered_lock = threading.Lock()


def render_manifest(spec: TrainingJobSpec) -> str:
    """Canonical YAML for the spec: `parse_manifest(render_manifest(s), ...) == s`."""
    key = id(spec)
    with _rendered_lock:
        hit = _rendered.get(key)
        if hit is not None and hit[0] is spec:
            _rendered.move_to_end(key)
            return hit[1]
    text = yaml.dump(_canonical(spec), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)
    with _rendered_lock:
        _rendered[key] = (spec, text)
        _rendered.move_to_end(key)
        while len(_rendered) > _RENDERED_MAX:
            _rendered.popitem(last=False)
    return text


def manifest_digest(spec: TrainingJobSpec) -> str:
    """sha256 of the canonical form: equal specs, however they were written, give equal digests.

    Hashed as compact JSON rather than as `render_manifest`'s YAML, so that a PyYAML upgrade that
    changes how text is laid out cannot make a retried submission look like a different job.
    """
    canonical = _DIGEST_ENCODE(_canonical(spec))
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


# `manifest_digest`'s encoder, kept (`json.dumps` builds one at every call with these arguments):
# the same arguments, the same text.
_DIGEST_ENCODE = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode
