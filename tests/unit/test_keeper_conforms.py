"""The keeper's protocol checks (`logs_keep.conforms`) answer as `isinstance` does, for every kind of
object a member cluster can be, while a class that has every member is answered without the walk.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Protocol, runtime_checkable

import pytest

from clusters.api import GangInspector, KilledPodLogs
from clusters.kubernetes import KubernetesBackend
from clusters.memory import InMemoryCluster
from federation.scheduling import logs_keep
from federation.scheduling.logs_keep import EndedReplicas


@runtime_checkable
class Reads(Protocol):
    def read(self) -> bytes: ...


@runtime_checkable
class Sized(Protocol):
    size: int


class Reader:
    def read(self) -> bytes:
        return b""


class Other:
    pass


def _instance_reader() -> object:
    found = Other()
    found.read = lambda: b""  # type: ignore[attr-defined]
    return found


@pytest.mark.parametrize(
    ("make", "protocol"),
    [
        pytest.param(Reader, Reads, id="class-with-the-member"),
        pytest.param(Other, Reads, id="class-without-it"),
        pytest.param(_instance_reader, Reads, id="instance-carries-what-its-class-lacks"),
        pytest.param(lambda: SimpleNamespace(read=lambda: b""), Reads, id="namespace-with-it"),
        pytest.param(SimpleNamespace, Reads, id="namespace-without-it"),
        pytest.param(lambda: SimpleNamespace(size=1), Sized, id="data-member-protocol"),
        pytest.param(Other, Sized, id="data-member-protocol-missing"),
    ],
)
def test_answers_as_isinstance_does(make: object, protocol: type) -> None:
    for _ in range(2):  # the second time from what the first kept
        obj = make()  # type: ignore[operator]
        assert logs_keep.conforms(obj, protocol) == isinstance(obj, protocol)


@pytest.mark.parametrize("protocol", [GangInspector, EndedReplicas, KilledPodLogs])
def test_the_member_clusters_backends_answer_as_before(protocol: type) -> None:
    for cls in (KubernetesBackend, InMemoryCluster):
        obj = object.__new__(cls)  # no cluster behind it: only its class is asked
        assert logs_keep.conforms(obj, protocol) == isinstance(obj, protocol)
