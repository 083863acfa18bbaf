"""List and watch parameters as a real API server reads them: selectors and resourceVersion rules.

The API concepts page defines what `resourceVersion` and `resourceVersionMatch` mean on a list:
unset is the newest state; `0` or `NotOlderThan` is any state at least that new; `Exact` is the
state at exactly that revision, `410 Gone` once it has left history; a revision the server has not
reached after waiting 3 s is `504` with the cause `ResourceVersionTooLarge` (for a watch, as an
ERROR event in the stream, which makes an informer relist). A field selector may name only the
fields the kind supports. Everything a real server refuses is refused here with the same code, so a
client that depends on the distinction (an informer relisting on 410) sees it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from clusters.sim import errors, paging
from clusters.sim.errors import ApiError
from clusters.sim.resources import VOLCANO_GROUPS, ResourceType
from clusters.sim.selectors import (
    FieldSelector,
    LabelSelector,
    check_field_selector,
    parse_field_selector,
    parse_label_selector,
)
from clusters.sim.store import ResourceGone, Store

Obj = dict[str, Any]
# How long a real API server waits for its cache to reach a requested resourceVersion.
FRESHNESS_WAIT_S = 3.0
_MATCHES = ("", "Exact", "NotOlderThan")


def selectors(rt: ResourceType, query: Mapping[str, str]) -> tuple[LabelSelector, FieldSelector]:
    labels = parse_label_selector(query.get("labelSelector"))
    fields = parse_field_selector(query.get("fieldSelector"))
    check_field_selector(rt.group, rt.plural, rt.namespaced, rt.group not in VOLCANO_GROUPS, fields)
    return labels, fields


def too_large(rv: int, current: int) -> ApiError:
    return ApiError(
        504,
        "Timeout",
        f"Timeout: Too large resource version: {rv}, current: {current}",
        {
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1,
        },
    )


def _requested_rv(query: Mapping[str, str]) -> int | None:
    text = query.get("resourceVersion", "")
    if text == "":
        return None
    try:
        rv = int(text)
    except ValueError as exc:
        raise errors.bad_request(f"invalid resourceVersion: {text!r}") from exc
    if rv < 0:
        raise errors.bad_request(f"invalid resourceVersion: {text!r}")
    return rv


def list_objects(
    store: Store, rt: ResourceType, namespace: str | None, query: Mapping[str, str]
) -> tuple[list[Obj], Obj]:
    """The items and list metadata of one list request (not a watch)."""
    labels, fields = selectors(rt, query)
    match = query.get("resourceVersionMatch", "")
    if match not in _MATCHES:
        raise errors.invalid_query(
            "resourceVersionMatch", f'Unsupported value: "{match}": supported values: "Exact", "NotOlderThan"'
        )
    rv = _requested_rv(query)
    if match and rv is None:
        raise errors.invalid_query(
            "resourceVersionMatch",
            "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
        )
    if query.get("continue") and match:
        raise errors.invalid_query(
            "resourceVersionMatch", "Forbidden: resourceVersionMatch is forbidden when continue is provided"
        )
    current = store.resource_version
    if rv is not None and rv > current:
        raise too_large(rv, current)
    if match == "Exact":
        if rv == 0:
            raise errors.invalid_query(
                "resourceVersionMatch",
                'Forbidden: resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
            )
        assert rv is not None
        try:
            items = store.list_at(rt, rv, namespace, labels, fields)
        except ResourceGone as exc:
            raise errors.gone(f"The resourceVersion for the provided list is too old: {exc}") from exc
        list_meta: Obj = {"resourceVersion": str(rv)}
    else:
        items = store.list(rt, namespace, labels, fields)
        list_meta = {"resourceVersion": str(current)}
    items = paging.page(items, list_meta, query.get("limit", ""), query.get("continue", ""))
    return items, list_meta


def check_watch(store: Store, query: Mapping[str, str]) -> bool:
    """Refuse what a real server refuses on a watch; True when initial events were asked for."""
    initial = query.get("sendInitialEvents", "")
    match = query.get("resourceVersionMatch", "")
    _requested_rv(query)  # refuses a malformed one
    if initial not in ("", "true", "false"):
        raise errors.bad_request(f"invalid sendInitialEvents: {initial!r}")
    if initial:
        if match != "NotOlderThan":
            raise errors.invalid_query(
                "resourceVersionMatch",
                'Forbidden: sendInitialEvents requires setting resourceVersionMatch to "NotOlderThan"',
            )
    elif match:
        raise errors.invalid_query(
            "resourceVersionMatch",
            "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        )
    return initial == "true"


async def wait_fresh(store: Store, query: Mapping[str, str]) -> None:
    """Wait, as a real server waits up to 3 s, for a requested resourceVersion the store has not reached."""
    rv = _requested_rv(query)
    if rv is None or rv <= store.resource_version:
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FRESHNESS_WAIT_S
    # Polled: the store has no per-revision signal, and this wait is rare and short.
    while store.resource_version < rv and loop.time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
