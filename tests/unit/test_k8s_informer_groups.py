"""The informer's items filed by group (issue 33): the Kubernetes backend finds an ended gang's pods
in its pod cache by the gang's name, without a list call or a walk of every pod. The groups must
stay equal to what the cache holds through every way it changes: a list, watch events (a pod
added, changed, moved to another group, deleted) and an object remembered after its create."""

from __future__ import annotations

from typing import Any

from clusters.kubernetes.kube import ListPath
from clusters.kubernetes.watch import Health, Informer

Json = dict[str, Any]


def pod(name: str, gang: str | None, rv: int, phase: str = "Running") -> Json:
    labels = {} if gang is None else {"gang": gang}
    return {
        "metadata": {"namespace": "ns", "name": name, "resourceVersion": str(rv), "labels": labels},
        "status": {"phase": phase},
    }


class Lister:
    def __init__(self, items: list[Json], rv: str) -> None:
        self.items = items
        self.rv = rv

    def list_page(self, path: ListPath, **_: Any) -> Json:
        return {"items": self.items, "metadata": {"resourceVersion": self.rv}}


def informer(api: Any) -> Informer[tuple[str, str | None, str]]:
    """Items are (name, gang, phase); the gang, where there is one, is the group."""
    return Informer(
        "pods",
        api,
        path=ListPath("/api/v1/pods"),
        parse=lambda o: (
            str(o["metadata"]["name"]),
            o["metadata"]["labels"].get("gang"),
            str(o["status"]["phase"]),
        ),
        health=Health(),
        watch_timeout_s=1,
        backoff_min_s=0.1,
        backoff_max_s=0.2,
        cluster="c0",
        group=lambda item: item[1],
    )


def grouped(cache: Informer[tuple[str, str | None, str]], gang: str) -> set[tuple[str, str]]:
    return {(name, phase) for name, _, phase in cache.grouped(gang)}


def consistent(cache: Informer[tuple[str, str | None, str]]) -> None:
    """Every item with a group is filed under it, and nothing else is filed anywhere."""
    _, items = cache.snapshot()
    expected: dict[str, set[str]] = {}
    for name, gang, _ in items:
        if gang is not None:
            expected.setdefault(gang, set()).add(name)
    assert {g: {name for name, _, _ in cache.grouped(g)} for g in expected} == expected
    assert set(cache._groups) == set(expected)


def test_a_list_files_each_gangs_pods_and_leaves_others_out() -> None:
    api = Lister([pod("a-0", "a", 1), pod("a-1", "a", 2), pod("b-0", "b", 3), pod("x", None, 4)], "10")
    cache = informer(api)
    cache._relist()
    assert grouped(cache, "a") == {("a-0", "Running"), ("a-1", "Running")}
    assert grouped(cache, "b") == {("b-0", "Running")}
    assert cache.grouped("x") == []
    assert cache.grouped("nobody") == []
    consistent(cache)


def test_watch_events_keep_the_groups_equal_to_the_cache() -> None:
    cache = informer(Lister([pod("a-0", "a", 1)], "10"))
    cache._relist()
    cache._apply({"type": "ADDED", "object": pod("a-1", "a", 11)})
    cache._apply({"type": "MODIFIED", "object": pod("a-0", "a", 12, phase="Succeeded")})
    assert grouped(cache, "a") == {("a-0", "Succeeded"), ("a-1", "Running")}
    # Relabelled into another gang (an operator's edit): it moves, it is not in both.
    cache._apply({"type": "MODIFIED", "object": pod("a-1", "c", 13)})
    assert grouped(cache, "a") == {("a-0", "Succeeded")}
    assert grouped(cache, "c") == {("a-1", "Running")}
    cache._apply({"type": "DELETED", "object": pod("a-0", "a", 14)})
    assert cache.grouped("a") == []
    consistent(cache)
    # Its label dropped: out of every group, still in the cache.
    cache._apply({"type": "MODIFIED", "object": pod("a-1", None, 15)})
    assert cache.grouped("c") == []
    assert len(cache.snapshot()[1]) == 1
    consistent(cache)


def test_a_remembered_pod_is_filed_and_a_later_list_refiles_everything() -> None:
    api = Lister([], "10")
    cache = informer(api)
    cache._relist()
    cache.remember(pod("a-0", "a", 12))
    assert grouped(cache, "a") == {("a-0", "Running")}
    # A list newer than the create that no longer shows the pod (deleted meanwhile) drops it from
    # its group too; one that shows other pods files them.
    api.items, api.rv = [pod("b-0", "b", 20)], "21"
    cache._relist()
    assert cache.grouped("a") == []
    assert grouped(cache, "b") == {("b-0", "Running")}
    consistent(cache)


def test_without_a_group_nothing_is_filed() -> None:
    api: Any = Lister([pod("a-0", "a", 1)], "10")
    cache: Informer[str] = Informer(
        "pods",
        api,
        path=ListPath("/api/v1/pods"),
        parse=lambda o: str(o["metadata"]["name"]),
        health=Health(),
        watch_timeout_s=1,
        backoff_min_s=0.1,
        backoff_max_s=0.2,
        cluster="c0",
    )
    cache._relist()
    assert cache.grouped("a") == []
    assert cache._groups == {}
