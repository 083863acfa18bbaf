"""The JSON wire form: the same spec as the YAML it came from, and the same refusals."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.errors import InvalidSpec
from federation.spec.manifest_text import wire_manifest
from federation.spec.priorities import DEFAULT_PRIORITY_CLASSES
from federation.spec.training_job import parse_manifest
from tests.properties import examples

EXAMPLES = sorted(
    p
    for p in (Path(__file__).resolve().parents[2] / "examples").glob("*.yaml")
    if p.name != "federation.yaml" and not p.name.startswith("invalid-")
)


def parse(text: str) -> object:
    return parse_manifest(text, priority_classes=DEFAULT_PRIORITY_CLASSES)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_wire_form_of_an_example_is_json_and_parses_to_the_same_spec(path: Path) -> None:
    text = path.read_text()
    wire = wire_manifest(text)
    assert json.loads(wire)["kind"] == "TrainingJob"
    assert parse(wire) == parse(text)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("a: [1, 2\n", id="broken-yaml"),
        pytest.param("a: &x 1\nb: *x\n", id="alias"),
        pytest.param("a: !!set {x, y}\n", id="no-json-form"),
    ],
)
def test_a_manifest_that_does_not_read_cleanly_is_sent_as_written(text: str) -> None:
    assert wire_manifest(text) == text


@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        pytest.param('{"a": 1, "a": 2}', "duplicate key", id="duplicate-key"),
        pytest.param('{"a": NaN}', "NaN", id="nan"),
        pytest.param('{"a": ' + "9" * 70 + "}", "at most 64 characters", id="long-number"),
        pytest.param('{"a": "\\ud800"}', "lone surrogate", id="surrogate"),
        pytest.param('{"a":' + "[" * 30 + "]" * 30 + "}", "deeper than 20", id="deep"),
        pytest.param('{"a":' + "[" * 5000 + "]" * 5000 + "}", "deeper than 20", id="very-deep"),
        pytest.param('{"a": [1,}', "not valid JSON", id="syntax"),
        pytest.param('{"a": [' + ",".join(["1"] * 60_000) + "]}", "more than 50000", id="too-many-values"),
    ],
)
def test_json_manifests_get_the_same_limits_as_yaml(text: str, phrase: str) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse(text)
    assert caught.value.field == "manifest"
    assert phrase in caught.value.rule


def test_field_errors_name_the_field_in_json_too() -> None:
    wire = wire_manifest((EXAMPLES[0]).read_text())
    document = json.loads(wire)
    document["spec"]["tasks"][0]["replicas"] = 0
    with pytest.raises(InvalidSpec) as caught:
        parse(json.dumps(document))
    assert caught.value.field == "spec.tasks[0].replicas"


@settings(max_examples=examples(200), deadline=None)
@given(st.text(max_size=300).map(lambda t: "{" + t))
def test_any_json_looking_text_raises_only_invalid_spec(text: str) -> None:
    with contextlib.suppress(InvalidSpec):
        parse(text)
