"""Paged lists (`limit` and `continue`), as clients that list thousands of pods ask for them.

gpufed's backend lists in pages of a few hundred, like an informer; without pages the simulator
would never exercise that path. The continue token is opaque to clients: here it is the list's
resourceVersion and the last key served, base64 JSON.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from clusters.sim import errors
from clusters.sim.store import key_of

Obj = dict[str, Any]


def page(items: list[Obj], list_meta: Obj, limit_text: str, token: str) -> list[Obj]:
    """`limit` and `continue` as a real server pages a list.

    Later pages carry the first page's resourceVersion, as a real server's do. They are cut from
    the current objects rather than a snapshot, so an object may show a newer state than that
    version; a watch from it then replays the change, which informers take in their stride.
    """
    if token:
        try:
            decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
            after = (str(decoded["ns"]), str(decoded["name"]))
            list_meta["resourceVersion"] = str(int(decoded["rv"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise errors.bad_request("continue key is not valid") from exc
        items = [o for o in items if key_of(o) > after]
    try:
        limit = int(limit_text) if limit_text else 0
    except ValueError as exc:
        raise errors.bad_request(f"invalid limit: {limit_text}") from exc
    if limit <= 0 or len(items) <= limit:
        return items
    page = items[:limit]
    last_ns, last_name = key_of(page[-1])
    cursor = {"rv": list_meta["resourceVersion"], "ns": last_ns, "name": last_name}
    list_meta["continue"] = base64.urlsafe_b64encode(json.dumps(cursor).encode()).decode()
    list_meta["remainingItemCount"] = len(items) - limit
    return page
