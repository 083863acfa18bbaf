"""An informer's look (`snapshot`) is copied once a version: every look until the next change shares
that copy, and the first look after a change sees the change.

The scheduler and the reconciler look at every member cluster each second, and most clusters have
not changed since their last look: each look copied the cluster's nodes and pods all the same, even
where the backend's memo (keyed by the versions) then answered without reading them.
"""

from __future__ import annotations

from typing import Any

from clusters.kubernetes.kube import ListPath
from clusters.kubernetes.watch import Health, Informer


def obj(name: str, rv: int) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": str(rv)}}


def informer() -> Informer[str]:
    return Informer(
        "pods",
        api=None,  # type: ignore[arg-type]  # no list or watch: the items come from `remember`
        path=ListPath("/api/v1/pods"),
        parse=lambda o: str(o["metadata"]["name"]),
        health=Health(),
        watch_timeout_s=1,
        backoff_min_s=0.1,
        backoff_max_s=0.2,
        cluster="c0",
    )


def test_looks_between_two_changes_share_one_copy_and_a_change_gives_a_new_one() -> None:
    cache = informer()
    cache.remember(obj("a", 1))
    first = cache.snapshot()
    assert first == (1, ("a",))
    assert cache.snapshot() is first, "a look at an unchanged cache copied it again"
    cache.remember(obj("b", 2))
    second = cache.snapshot()
    assert second == (2, ("a", "b"))
    assert cache.snapshot() is second
    # The earlier look is as it was: a copy, not a view of the items as they are now.
    assert first == (1, ("a",))


def test_a_look_is_immutable() -> None:
    cache = informer()
    cache.remember(obj("a", 1))
    _, items = cache.snapshot()
    assert isinstance(items, tuple)
