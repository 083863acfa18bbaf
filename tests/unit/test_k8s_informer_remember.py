"""An object the backend just created and remembered survives a list that was taken before its
create: the first gangs dispatched while the Volcano watch made its first list used to vanish for the
moment the watch took, and federation read that as gangs lost (and restarted them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from clusters.kubernetes.kube import ListPath
from clusters.kubernetes.watch import Health, Informer

Json = dict[str, Any]


def obj(name: str, rv: int) -> Json:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": str(rv)}}


class ListDuringCreate:
    """A list page at `listed_rv`; `during` runs while the list is in flight (a create meanwhile)."""

    def __init__(self, items: list[Json], listed_rv: str, during: Callable[[], None]) -> None:
        self.items = items
        self.listed_rv = listed_rv
        self.during = during

    def list_page(self, path: ListPath, **_: Any) -> Json:
        self.during()
        return {"items": self.items, "metadata": {"resourceVersion": self.listed_rv}}


def informer(api: Any) -> Informer[str]:
    return Informer(
        "vcjobs",
        api,
        path=ListPath("/apis/batch.volcano.sh/v1alpha1/jobs"),
        parse=lambda o: str(o["metadata"]["name"]),
        health=Health(),
        watch_timeout_s=1,
        backoff_min_s=0.1,
        backoff_max_s=0.2,
        cluster="c0",
    )


def names(cache: Informer[str]) -> set[str]:
    return set(cache.snapshot()[1])


@pytest.mark.parametrize(
    ("created_rv", "listed_rv", "kept"),
    [
        pytest.param(11, "10", True, id="created-after-the-list-snapshot-is-kept"),
        pytest.param(10, "10", False, id="in-the-snapshot-yet-missing-means-gone"),
        pytest.param(9, "10", False, id="older-than-the-snapshot-and-missing-means-gone"),
        pytest.param(11, "", False, id="a-list-without-a-numeric-version-drops-it-as-before"),
    ],
)
def test_a_remembered_object_and_a_list_in_flight(created_rv: int, listed_rv: str, kept: bool) -> None:
    api = ListDuringCreate([obj("old", 5)], listed_rv, during=lambda: None)
    cache = informer(api)
    api.during = lambda: cache.remember(obj("new", created_rv))
    cache._relist()
    assert names(cache) == ({"old", "new"} if kept else {"old"})


def test_a_watch_event_ends_the_remembering() -> None:
    """Once the watch has shown the object (here its deletion), a later list decides alone."""
    api = ListDuringCreate([], "10", during=lambda: None)
    cache = informer(api)
    cache._relist()
    cache.remember(obj("new", 12))
    cache._apply({"type": "DELETED", "object": obj("new", 13)})
    assert names(cache) == set()
    api.listed_rv = "11"  # a list older than the create, answered after the deletion
    cache._relist()
    assert names(cache) == set()


def test_the_list_still_replaces_what_it_shows() -> None:
    """A remembered object the list does show is the list's copy (and is no longer remembered)."""
    api = ListDuringCreate([obj("new", 11)], "12", during=lambda: None)
    cache = informer(api)
    cache.remember(obj("new", 11))
    cache._relist()
    assert names(cache) == {"new"}
    assert cache._remembered == {}
