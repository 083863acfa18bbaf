"""The kept encoders write what `json.dumps` wrote with the same arguments: a stored record's bytes
and a manifest's digest are unchanged (the digest answers retries of submissions made before)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from federation.spec.priorities import DEFAULT_PRIORITY_CLASSES
from federation.spec.training_job import _canonical, manifest_digest, parse_manifest
from federation.store import job_store
from federation.store.jobs import job_to_dict
from federation.store.schema_version import dumps
from tests.conftest import build_job
from tests.properties import examples

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and both infinities too: written as json.dumps writes them
    | st.text(max_size=8),  # non-ASCII too: escaped as json.dumps escapes it
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=examples(300), deadline=None)
@given(st.dictionaries(st.text(max_size=6), values, max_size=6))
def test_a_document_is_written_as_schema_version_dumps_writes_it(doc: dict[str, object]) -> None:
    assert job_store._dumps(doc) == dumps(doc)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(values, max_size=5))
def test_a_list_is_written_as_json_dumps_writes_it(doc: list[object]) -> None:
    assert job_store._dumps(doc) == json.dumps(doc, separators=(",", ":")).encode()


def test_a_job_record_is_written_as_before() -> None:
    job = dataclasses.replace(build_job("train-1a2b3c4d"), message="zürich ✓", submitted_at_s=math.inf)
    written = job_store._dumps(job_to_dict(job))
    assert written == dumps(job_to_dict(job))
    assert b"\\u00fc" in written
    assert b"Infinity" in written


def test_the_digest_is_the_one_json_dumps_gave() -> None:
    spec = parse_manifest(
        json.dumps(
            {
                "apiVersion": "gpufed.io/v1",
                "kind": "TrainingJob",
                "metadata": {"name": "j", "annotations": {"note": "naïve ✓"}},
                "spec": {
                    "gpuTypes": ["A100"],
                    "tasks": [{"name": "w", "replicas": 2, "gpus": 1, "image": "x"}],
                },
            }
        ),
        priority_classes=DEFAULT_PRIORITY_CLASSES.keys(),
    )
    before = json.dumps(_canonical(spec), ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    assert manifest_digest(spec) == hashlib.sha256(before.encode("ascii")).hexdigest()
