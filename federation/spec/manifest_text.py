"""Untrusted manifest text to plain values, or `InvalidSpec`.

The defensive half of `federation.spec.training_job`.

Manifests come from untrusted callers, so loading is defensive before it is helpful: the size is
capped before parsing, anchors and aliases are refused (no "billion laughs"), nesting is bounded,
and there must be one document with string keys and no duplicate keys (PyYAML would silently keep
the last). A single pass over PyYAML's event stream builds the values. JSON manifests (what the CLI
sends) go through `manifest_json` under the same limits.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from federation.errors import InvalidSpec
from federation.spec.manifest_json import load_json_manifest, looks_like_json, to_json_text

MAX_MANIFEST_BYTES = 256 * 1024
MAX_DEPTH = 20
# Bounds on what building the values may cost, checked while scanning. The largest manifest the
# rules allow has about 25,000 values (16 tasks of 256 command items and 256 env entries); a
# hostile 256 KiB one could have ten times that. A huge hex or base-60 number is costly to build.
MAX_VALUES = 50_000
_MAX_NUMBER_CHARS = 64
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Maps whose keys are user data: their entries are shown as `metadata.labels["app"]`.
_FREE_FORM = re.compile(
    r"metadata\.(labels|annotations)|spec\.tasks\[\d+\]\.env"
    r"|spec\.tasks\[\d+\]\.template\.(metadata\.(labels|annotations)|spec\.nodeSelector)"
)
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_STR_TAG = "tag:yaml.org,2002:str"
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
_TAG_WORDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "null": "null",
    "merge": "a merge key, which is not supported",
}


def _timestamp_or_text(loader: yaml.SafeLoader | yaml.CSafeLoader, node: yaml.ScalarNode) -> object:
    """An impossible timestamp (month 13) stays text, so `spec.deadline` can report it by name."""
    try:
        return loader.construct_yaml_timestamp(node)
    except ValueError:
        return loader.construct_scalar(node)


class _PureLoader(yaml.SafeLoader):
    pass


_Loader: type[yaml.SafeLoader] | type[yaml.CSafeLoader] = _PureLoader
if yaml.__with_libyaml__:

    class _FastLoader(yaml.CSafeLoader):
        pass

    _Loader = _FastLoader

for _cls in {_PureLoader, _Loader}:
    _cls.add_constructor("tag:yaml.org,2002:timestamp", _timestamp_or_text)


@dataclass(slots=True)
class _Open:
    """A mapping or list being scanned: where it is, and what its next child will be called."""

    path: str
    is_mapping: bool
    value: dict[str, object] | list[object]
    index: int = 0
    key: str | None = None
    key_lines: dict[str, int] = field(default_factory=dict)


def field_path(path: str) -> str:
    return path or "manifest"


def shorten(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def key_path(path: str, key: str) -> str:
    if _FREE_FORM.fullmatch(path) or not _PLAIN_KEY.fullmatch(key) or len(key) > 60:
        shown = key if len(key) <= 60 else key[:60] + "..."
        return f"{path}[{json.dumps(shown)}]"
    return f"{path}.{key}" if path else key


def _at(mark: Any) -> str:
    return "" if mark is None else f"at line {mark.line + 1}, column {mark.column + 1}"


def _yaml_problem(error: yaml.YAMLError) -> str:
    if isinstance(error, yaml.reader.ReaderError):
        char = error.character
        code = ord(char) if isinstance(char, str) else char
        return f"{error.reason}, found #x{code:04x} at character {error.position}"
    if isinstance(error, yaml.MarkedYAMLError):
        return f"{error.problem or error.context} {_at(error.problem_mark)}".strip()
    return str(error)


def _tag(loader: Any, event: yaml.ScalarEvent) -> str:
    if event.tag is None or event.tag == "!":
        tag: str = loader.resolve(yaml.ScalarNode, event.value, event.implicit)
        return tag
    return event.tag


def _scan(text: str) -> object:
    """Walk the parse events once: refuse what a safe manifest never needs, and build the values.

    Building here rather than loading again after the checks parses the text once: manifest
    parsing was the largest single cost of a submission.
    """
    stack: list[_Open] = []
    documents = values = 0
    loader = None
    root: object = None
    needs_loader = False
    try:
        # Inside the try: the pure-Python reader checks for control characters on construction.
        loader = _Loader(text)
        while loader.check_event():
            event = loader.get_event()
            if event is None:
                break
            if isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise InvalidSpec(
                        "manifest", f"must be a single YAML document, found another {_at(event.start_mark)}"
                    )
            if isinstance(event, yaml.CollectionEndEvent):
                stack.pop()
            if not isinstance(event, yaml.NodeEvent):
                continue
            values += 1
            if values > MAX_VALUES:
                raise InvalidSpec(
                    "manifest", f"holds more than {MAX_VALUES} keys and values {_at(event.start_mark)}"
                )
            parent = stack[-1] if stack else None
            is_key = parent is not None and parent.is_mapping and parent.key is None
            value_key = ""
            if parent is None:
                path = ""
            elif is_key:
                path = parent.path
            elif parent.is_mapping:
                value_key = parent.key or ""
                path, parent.key = key_path(parent.path, value_key), None
            else:
                path, parent.index = f"{parent.path}[{parent.index}]", parent.index + 1
            if isinstance(event, yaml.AliasEvent) or event.anchor is not None:
                sign = "*" if isinstance(event, yaml.AliasEvent) else "&"
                raise InvalidSpec(
                    field_path(path),
                    f"YAML anchors and aliases are not allowed, found {sign}{event.anchor} "
                    + _at(event.start_mark),
                )
            if isinstance(event, yaml.ScalarEvent):
                if _SURROGATE.search(event.value):
                    raise InvalidSpec(
                        field_path(path),
                        f"holds a lone surrogate (not valid Unicode) {_at(event.start_mark)}",
                    )
                if is_key and parent is not None:
                    parent.key = _mapping_key(parent, event, _tag(loader, event))
                    continue
                tag = _tag(loader, event)
                if len(event.value) > _MAX_NUMBER_CHARS and tag in _NUMBER_TAGS:
                    raise InvalidSpec(
                        field_path(path),
                        f"numbers may have at most {_MAX_NUMBER_CHARS} characters {_at(event.start_mark)}",
                    )
                # libyaml's marks are its own type; constructors only read them for error messages.
                node = yaml.ScalarNode(tag, event.value, None, None, event.style)
                built = event.value if tag == _STR_TAG else loader.construct_object(node)
                root = _attach(parent, value_key, built, root)
            elif is_key:
                raise InvalidSpec(
                    field_path(path),
                    f"mapping keys must be strings, found a collection as a key {_at(event.start_mark)}",
                )
            elif isinstance(event, yaml.CollectionStartEvent):
                if len(stack) >= MAX_DEPTH:
                    raise InvalidSpec(
                        "manifest", f"nests deeper than {MAX_DEPTH} levels {_at(event.start_mark)}"
                    )
                is_mapping = isinstance(event, yaml.MappingStartEvent)
                if event.tag not in (None, "!", _MAP_TAG if is_mapping else _SEQ_TAG):
                    # An explicitly tagged collection (!!set, !!omap, or an unknown tag): rare, so
                    # let the loader build (or refuse) the whole document as it always has.
                    needs_loader = True
                container: dict[str, object] | list[object] = {} if is_mapping else []
                root = _attach(parent, value_key, container, root)
                stack.append(_Open(path, is_mapping, container))
    except yaml.YAMLError as error:
        problem = _yaml_problem(error)
        if "maximum nesting depth" in problem:
            # libyaml (PyYAML 6.0.4 on) stops runaway nesting itself, in its look-ahead, before our
            # own depth check sees the events: say the same thing either way.
            raise InvalidSpec("manifest", f"nests deeper than {MAX_DEPTH} levels ({problem})") from None
        raise InvalidSpec("manifest", f"is not valid YAML: {problem}") from None
    except (ValueError, TypeError, OverflowError) as error:  # from constructors, e.g. `!!int abc`
        raise InvalidSpec("manifest", f"holds a value YAML cannot build: {error}") from None
    finally:
        if loader is not None:
            loader.dispose()
    return _load_with_loader(text) if needs_loader else root


def _load_with_loader(text: str) -> object:
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as error:
        raise InvalidSpec("manifest", f"is not valid YAML: {_yaml_problem(error)}") from None
    except (ValueError, TypeError, OverflowError) as error:  # from constructors, e.g. `!!int abc`
        raise InvalidSpec("manifest", f"holds a value YAML cannot build: {error}") from None
    finally:
        loader.dispose()


def _attach(parent: _Open | None, key: str, value: object, root: object) -> object:
    """Put a built value into its container; returns the document's root value."""
    if parent is None:
        return value
    if isinstance(parent.value, dict):
        parent.value[key] = value
    else:
        parent.value.append(value)
    return root


def _mapping_key(parent: _Open, event: yaml.ScalarEvent, tag: str) -> str:
    where = _at(event.start_mark)
    if tag != _STR_TAG:
        kind = tag.rsplit(":", 1)[-1]
        reads_as = _TAG_WORDS.get(kind, f"{kind} ({tag})")
        raise InvalidSpec(
            field_path(parent.path),
            f"mapping keys must be strings, found {shorten(event.value)} {where}, which YAML reads as "
            f"{reads_as}; quote it",
        )
    if event.value in parent.key_lines:
        raise InvalidSpec(
            key_path(parent.path, event.value),
            f"duplicate key (first at line {parent.key_lines[event.value]}, again {where}); "
            "YAML would silently keep only the last",
        )
    parent.key_lines[event.value] = event.start_mark.line + 1 if event.start_mark else 0
    return event.value


def load_manifest_text(text: str | bytes) -> object:
    if isinstance(text, bytes | bytearray):
        if len(text) > MAX_MANIFEST_BYTES:
            raise InvalidSpec("manifest", f"is {len(text)} bytes, over the limit of {MAX_MANIFEST_BYTES}")
        try:
            text = bytes(text).decode("utf-8-sig")
        except UnicodeDecodeError as error:
            raise InvalidSpec(
                "manifest", f"is not UTF-8 text: byte {text[error.start]:#04x} at offset {error.start}"
            ) from None
    elif not isinstance(text, str):
        raise InvalidSpec("manifest", f"must be text or bytes, got {type(text).__name__}")
    elif len(text) > MAX_MANIFEST_BYTES:
        raise InvalidSpec(
            "manifest", f"is {len(text)} characters, over the limit of {MAX_MANIFEST_BYTES} bytes"
        )
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as error:
            raise InvalidSpec(
                "manifest", f"is not valid Unicode: {error.reason} at character {error.start}"
            ) from None
        if size > MAX_MANIFEST_BYTES:
            raise InvalidSpec("manifest", f"is {size} bytes, over the limit of {MAX_MANIFEST_BYTES}")
    if looks_like_json(text):
        return load_json_manifest(
            text, max_depth=MAX_DEPTH, max_values=MAX_VALUES, max_number_chars=_MAX_NUMBER_CHARS
        )
    return _scan(text)


def wire_manifest(text: str) -> str:
    """What a client sends for a user's manifest: JSON when the YAML reads cleanly here.

    The same strict loader runs on the user's machine, so the server reads cheap JSON; a manifest
    that does not read (or has no JSON form) is sent as written, for the server's authoritative error.
    """
    if looks_like_json(text) or len(text.encode()) > MAX_MANIFEST_BYTES:
        return text
    try:
        document = _scan(text)
    except InvalidSpec:
        return text
    return to_json_text(document) or text
