"""The JSON manifest's two checks of the read tree: the depth alone where the text cannot break the
other limits, the whole walk elsewhere. Both must refuse exactly what the whole walk refuses."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.errors import InvalidSpec
from federation.spec import manifest_json
from federation.spec.manifest_json import load_json_manifest
from tests.properties import examples

LIMITS = {"max_depth": 20, "max_values": 50_000, "max_number_chars": 64}


def nested(levels: int) -> str:
    """A document whose innermost container is at depth `levels - 1` (the root is at 0)."""
    return '{"a":' * (levels - 1) + "{}" + "}" * (levels - 1)


@pytest.mark.parametrize("container", ["{}", "[]"])
def test_the_depth_limit_is_the_same_on_the_short_path(container: str) -> None:
    ok = '{"a":' * 19 + container + "}" * 19  # innermost at depth 19: allowed
    load_json_manifest(ok, **LIMITS)
    deep = '{"a":' * 20 + container + "}" * 20  # depth 20: refused
    with pytest.raises(InvalidSpec, match="deeper than 20"):
        load_json_manifest(deep, **LIMITS)


def test_a_lone_surrogate_in_the_text_itself_is_refused() -> None:
    # Not an escape: the character itself (a caller other than the manifest reader may pass one).
    with pytest.raises(InvalidSpec, match="lone surrogate"):
        load_json_manifest('{"a": "x\ud800"}', **LIMITS)
    with pytest.raises(InvalidSpec, match="lone surrogate"):
        load_json_manifest('{"k\udfff": 1}', **LIMITS)


def test_an_escaped_surrogate_pair_reads_and_a_lone_one_does_not() -> None:
    assert load_json_manifest('{"a": "\\ud83d\\ude00"}', **LIMITS) == {"a": "\U0001f600"}
    with pytest.raises(InvalidSpec, match="lone surrogate"):
        load_json_manifest('{"a": "\\udc00"}', **LIMITS)


def test_more_values_than_the_limit_are_refused_when_the_text_is_longer_than_it() -> None:
    text = "[" + ",".join(["1"] * 30) + "]"
    with pytest.raises(InvalidSpec, match="more than 20 keys and values"):
        load_json_manifest(text, max_depth=20, max_values=20, max_number_chars=64)
    # As many characters as the limit cannot hold more values than it: read.
    assert load_json_manifest("[1,2,3]", max_depth=20, max_values=7, max_number_chars=64) == [1, 2, 3]


def test_hooks_of_the_kept_decoder_still_refuse() -> None:
    with pytest.raises(InvalidSpec, match="duplicate key"):
        load_json_manifest('{"a": 1, "a": 2}', **LIMITS)
    with pytest.raises(InvalidSpec, match="at most 3 characters"):
        load_json_manifest('{"a": 1234}', max_depth=20, max_values=100, max_number_chars=3)
    # Another limit gets a decoder of its own: the first one's limit is not reused.
    assert load_json_manifest('{"a": 1234}', **LIMITS) == {"a": 1234}
    with pytest.raises(InvalidSpec, match="not a number"):
        load_json_manifest('{"a": Infinity}', **LIMITS)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
    max_leaves=40,
)


def outcome(check: object) -> str | None:
    try:
        check()  # type: ignore[operator]
    except InvalidSpec as error:
        return error.rule
    return None


@settings(max_examples=examples(300), deadline=None)
@given(json_values, st.integers(min_value=1, max_value=6))
def test_the_depth_check_refuses_what_the_whole_walk_refuses(doc: object, max_depth: int) -> None:
    # Documents with no lone surrogates and far fewer values than the limit: where the short path
    # is taken, its answer must be the whole walk's.
    text = json.dumps(doc, ensure_ascii=False)
    if any("\ud800" <= c <= "\udfff" for c in text):
        return
    whole = outcome(
        lambda: manifest_json._check_tree(json.loads(text), max_depth=max_depth, max_values=10**6)
    )
    short = outcome(lambda: manifest_json._check_depth(json.loads(text), max_depth=max_depth))
    assert short == whole
    read = outcome(
        lambda: load_json_manifest(text, max_depth=max_depth, max_values=10**6, max_number_chars=64)
    )
    assert read == whole
