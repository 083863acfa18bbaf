"""Issue 30 item 11: an admission records why it went where it went, and `explain` of the running
job words it: the price and type, the data, what it beat, and a cheaper offer passed over as full."""

from __future__ import annotations

import pytest

from placement.explain import admitted
from placement.model import CapacityKind
from placement.plan import plan
from tests.unit.placement_builders import SnapshotBuilder, a_cluster, a_gang, a_snapshot, a_tenant

NOW = 1000.0


def two_clusters(private_free: tuple[int, ...] = (8, 8)) -> SnapshotBuilder:
    return (
        a_snapshot()
        .clusters(
            a_cluster("onprem").pool("A100", free=private_free, price=1.1).store("onprem-s3"),
            a_cluster("cloud").pool("A100", nodes=2, kind=CapacityKind.ON_DEMAND, price=4.0).store("s3"),
        )
        .tenants(a_tenant("t1"))
    )


CASES = [
    pytest.param(
        two_clusters().queue(a_gang("j").tenant("t1").gang(1).runtime(expected_s=3600)),
        [
            "placed on cluster onprem (A100, private, $1.10/GPU-hour): expected $8.80 for about 1.00 h "
            "of work at A100 speed 1, the cheapest placement with room now",
            "it beat cluster cloud (A100, on_demand, $4.00/GPU-hour, expected $32.00)",
        ],
        id="cheapest-private-beat-the-cloud",
    ),
    pytest.param(
        two_clusters(private_free=(0, 4)).queue(a_gang("j").tenant("t1").gang(1).runtime(expected_s=3600)),
        [
            "placed on cluster cloud (A100, on_demand, $4.00/GPU-hour)",
            "no other placement had room",
            "cluster onprem (A100, private, $1.10/GPU-hour, expected $8.80) would have been cheaper but "
            "had no room",
        ],
        id="private-full-so-the-cloud",
    ),
    pytest.param(
        two_clusters()
        .egress("s3", "onprem-s3", 0.09)
        .queue(a_gang("j").tenant("t1").gang(1).runtime(expected_s=3600).dataset(100_000_000_000, "s3")),
        ["the job's dataset"],
        id="data-named",
    ),
]


@pytest.mark.parametrize(("snapshot", "expected"), CASES)
def test_why_an_admission_went_there(snapshot: SnapshotBuilder, expected: list[str]) -> None:
    (admission,) = plan(snapshot.build(), now=NOW).admissions
    text = admitted(admission)
    for part in expected:
        assert part in text, text


def test_data_in_place_or_moved_is_said_with_its_cost() -> None:
    snapshot = (
        two_clusters()
        .egress("s3", "onprem-s3", 0.09)
        .queue(a_gang("j").tenant("t1").gang(1).runtime(expected_s=36_000).dataset(100_000_000_000, "s3"))
        .build()
    )
    (admission,) = plan(snapshot, now=NOW).admissions
    text = admitted(admission)
    if admission.cluster == "onprem":
        assert "the job's dataset moves from store s3 to onprem-s3 ($9.00 egress" in text, text
        assert "it beat cluster cloud" in text, text
    else:
        assert "is read in place from store s3" in text, text
