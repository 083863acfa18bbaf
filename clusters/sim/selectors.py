"""Label and field selectors, parsed once per request and matched per object.

The string forms are the ones clients put in `labelSelector=` and `fieldSelector=`; the object form
(`matchLabels` / `matchExpressions`) is what a Job's selector and a node affinity term carry. Field
selectors are checked against the fields the real API server supports for each kind
(`SELECTABLE_FIELDS`); any other field is refused with `400 BadRequest`, as a real server refuses it,
and a field the object leaves unset compares as its default (`spec.unschedulable=false` matches a
node that never set it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from clusters.sim.errors import bad_request

Obj = dict[str, Any]


class Op(StrEnum):
    EQ = "="
    NE = "!="
    IN = "in"
    NOT_IN = "notin"
    EXISTS = "exists"
    NOT_EXISTS = "!"


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: Op
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        match self.op:
            case Op.EQ | Op.IN:
                return present and value in self.values
            case Op.NE | Op.NOT_IN:
                return not present or value not in self.values
            case Op.EXISTS:
                return present
            case Op.NOT_EXISTS:
                return not present
        return False  # pragma: no cover - the match is exhaustive


@dataclass(frozen=True, slots=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    def equalities(self) -> list[tuple[str, str]]:
        """The `key=value` pairs, which the store answers from its label index."""
        return [
            (r.key, next(iter(r.values)))
            for r in self.requirements
            if r.op is Op.EQ or (r.op is Op.IN and len(r.values) == 1)
        ]

    @property
    def empty(self) -> bool:
        return not self.requirements


EVERYTHING = LabelSelector()


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside `in (a,b)` parentheses."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def parse_label_selector(text: str | None) -> LabelSelector:
    if not text:
        return EVERYTHING
    reqs: list[Requirement] = []
    for part in _split_top_level(text):
        reqs.append(_parse_requirement(part))
    return LabelSelector(tuple(reqs))


def _parse_requirement(part: str) -> Requirement:
    if "!=" in part:
        key, value = part.split("!=", 1)
        return Requirement(key.strip(), Op.NE, frozenset({value.strip()}))
    if "==" in part:
        key, value = part.split("==", 1)
        return Requirement(key.strip(), Op.EQ, frozenset({value.strip()}))
    if "=" in part:
        key, value = part.split("=", 1)
        return Requirement(key.strip(), Op.EQ, frozenset({value.strip()}))
    words = part.split(None, 1)
    if len(words) == 2 and "(" in words[1]:
        op_word, rest = words[1].split("(", 1)
        op_word = op_word.strip()
        if not rest.endswith(")") or op_word not in ("in", "notin"):
            raise bad_request(f"unable to parse requirement: {part!r}")
        values = frozenset(v.strip() for v in rest[:-1].split(",") if v.strip())
        return Requirement(words[0], Op.IN if op_word == "in" else Op.NOT_IN, values)
    if part.startswith("!"):
        return Requirement(part[1:].strip(), Op.NOT_EXISTS)
    if len(words) == 1:
        return Requirement(part, Op.EXISTS)
    raise bad_request(f"unable to parse requirement: {part!r}")


def from_label_selector_object(selector: Mapping[str, Any] | None) -> LabelSelector:
    """A `metav1.LabelSelector` (`matchLabels`, `matchExpressions`) as a matcher."""
    if not selector:
        return EVERYTHING
    reqs = [
        Requirement(k, Op.EQ, frozenset({str(v)})) for k, v in (selector.get("matchLabels") or {}).items()
    ]
    for expr in selector.get("matchExpressions") or []:
        reqs.append(_expression(expr))
    return LabelSelector(tuple(reqs))


_EXPRESSION_OPS = {"In": Op.IN, "NotIn": Op.NOT_IN, "Exists": Op.EXISTS, "DoesNotExist": Op.NOT_EXISTS}


def _expression(expr: Mapping[str, Any]) -> Requirement:
    op = _EXPRESSION_OPS.get(str(expr.get("operator")))
    if op is None:
        raise bad_request(f"unsupported selector operator {expr.get('operator')!r}")
    return Requirement(str(expr.get("key")), op, frozenset(str(v) for v in expr.get("values") or []))


def node_selector_terms_match(terms: Sequence[Mapping[str, Any]], labels: Mapping[str, str]) -> bool:
    """Node affinity's required terms: any term matches when all its expressions do."""
    if not terms:
        return True
    for term in terms:
        exprs = term.get("matchExpressions") or []
        if all(_expression(e).matches(labels) for e in exprs):
            return True
    return False


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    path: tuple[str, ...]
    value: str
    negate: bool

    def matches(self, obj: Obj) -> bool:
        return (field_value(obj, self.path) == self.value) != self.negate


@dataclass(frozen=True, slots=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: Obj) -> bool:
        return all(r.matches(obj) for r in self.requirements)

    def value_of(self, field: str) -> str | None:
        """The value an `=` requirement pins `field` to, used to narrow a list to one name."""
        path = tuple(field.split("."))
        for r in self.requirements:
            if r.path == path and not r.negate:
                return r.value
        return None


NO_FIELDS = FieldSelector()


def parse_field_selector(text: str | None) -> FieldSelector:
    if not text:
        return NO_FIELDS
    reqs: list[FieldRequirement] = []
    for part in _split_top_level(text):
        if "!=" in part:
            key, value = part.split("!=", 1)
            negate = True
        elif "==" in part:
            key, value = part.split("==", 1)
            negate = False
        elif "=" in part:
            key, value = part.split("=", 1)
            negate = False
        else:
            raise bad_request(f"invalid field selector: {part!r}")
        reqs.append(FieldRequirement(tuple(key.strip().split(".")), value.strip(), negate))
    return FieldSelector(tuple(reqs))


# The fields a real API server lets a field selector name, beyond `metadata.name` and (for
# namespaced kinds) `metadata.namespace`, keyed by (group, plural). Custom resources (Volcano's)
# have none.
SELECTABLE_FIELDS: dict[tuple[str, str], frozenset[str]] = {
    ("", "pods"): frozenset(
        {
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.podIPs",
            "status.nominatedNodeName",
        }
    ),
    ("", "nodes"): frozenset({"spec.unschedulable"}),
    ("", "namespaces"): frozenset({"status.phase"}),
    ("", "events"): frozenset(
        {
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        }
    ),
    ("", "secrets"): frozenset({"type"}),
    ("batch", "jobs"): frozenset({"status.successful"}),
}
# Fields whose unset value the server compares as something other than "".
_DEFAULTS: dict[tuple[str, ...], str] = {("spec", "unschedulable"): "false", ("spec", "hostNetwork"): "false"}
# Fields that are not a plain path into the object.
_DERIVED: dict[tuple[str, ...], tuple[str, ...]] = {("source",): ("source", "component")}


def check_field_selector(
    group: str, plural: str, namespaced: bool, builtin: bool, selector: FieldSelector
) -> None:
    """Refuse, as a real server does, a selector on a field the kind does not support."""
    allowed = {"metadata.name"} | ({"metadata.namespace"} if namespaced or builtin else set())
    allowed |= SELECTABLE_FIELDS.get((group, plural), frozenset())
    for requirement in selector.requirements:
        field = ".".join(requirement.path)
        if field in allowed:
            continue
        if builtin:
            raise bad_request(
                f'Unable to find "{group}/{plural}" that match field selector "{field}": '
                f"field label not supported: {field}"
            )
        known = ", ".join(f'"{f}"' for f in sorted(allowed))
        raise bad_request(
            f'Unable to find "{plural}.{group}" that match field selector "{field}": '
            f'"{field}" is not a known field selector: only {known}'
        )


def field_value(obj: Obj, path: Sequence[str]) -> str:
    """A field as the API server compares it: unset is its default, booleans are "true"/"false"."""
    key = tuple(path)
    if key == ("status", "podIPs"):
        ips = (obj.get("status") or {}).get("podIPs") or []
        return ",".join(str(ip.get("ip", "")) for ip in ips if isinstance(ip, dict))
    path = _DERIVED.get(key, path)
    current: Any = obj
    for step in path:
        if not isinstance(current, dict):
            return ""
        current = current.get(step)
    if current is None:
        return _DEFAULTS.get(key, "")
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)
