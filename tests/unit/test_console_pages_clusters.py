"""The clusters page from API replies built by hand (no server)."""

from __future__ import annotations

import re

from federation.api.v1 import gpufed_pb2 as pb
from federation.console.clusters import build_clusters, promised_by_site, render_clusters

EVIL = '<img src=x onerror="alert(1)">'

REPLY = pb.ListClustersResponse(
    clusters=[
        pb.Cluster(
            name="onprem",
            provider="private",
            region="dc1",
            reachable=True,
            pools=[
                pb.Pool(
                    name="a100",
                    gpu_type="A100",
                    capacity_kind="private",
                    usd_per_gpu_hour=1.1,
                    gpus_per_node=8,
                    node_count=4,
                    free_gpus=20,
                )
            ],
        ),
        pb.Cluster(
            name="aws",
            provider="aws",
            region="us-east-1",
            reachable=True,
            state="refusing",
            last_error=EVIL,
            refused_jobs=2,
            pools=[
                pb.Pool(
                    name="h100-od",
                    gpu_type="H100",
                    capacity_kind="on_demand",
                    usd_per_gpu_hour=6.88,
                    gpus_per_node=8,
                    node_count=2,
                    free_gpus=16,
                ),
                pb.Pool(
                    name="h100-spot",
                    gpu_type="H100",
                    capacity_kind="spot",
                    usd_per_gpu_hour=1.28,
                    gpus_per_node=8,
                    node_count=1,
                    free_gpus=0,
                ),
                pb.Pool(
                    name="a100-od",
                    gpu_type="A100",
                    capacity_kind="on_demand",
                    usd_per_gpu_hour=2.7447,
                    gpus_per_node=8,
                    node_count=1,
                    free_gpus=8,
                ),
            ],
        ),
        pb.Cluster(name="gone", provider="gcp", region="x", reachable=False),
    ]
)


def test_free_used_and_promised_per_type_and_cluster() -> None:
    jobs = [
        pb.Job(phase=pb.JOB_PHASE_ADMITTED, cluster="onprem", gpu_type="A100", gpu_count=8),
        pb.Job(phase=pb.JOB_PHASE_STAGING, cluster="onprem", gpu_type="A100", gpu_count=4),
        # Running jobs are in the inventory's used GPUs already.
        pb.Job(phase=pb.JOB_PHASE_RUNNING, cluster="onprem", gpu_type="A100", gpu_count=12),
    ]
    view = build_clusters(REPLY, promised_by_site(jobs))
    onprem = next(s for s in view.by_type["A100"] if s.cluster == "onprem")
    assert (onprem.total, onprem.used, onprem.promised, onprem.free) == (32, 12, 12, 8)
    aws_h100 = view.by_type["H100"][0]
    assert (aws_h100.total, aws_h100.used, aws_h100.free) == (24, 8, 16)
    assert [s.cluster for s in view.by_type["A100"]] == ["aws", "onprem"]


def test_page_shows_prices_reachability_and_escapes_every_value() -> None:
    html = render_clusters(build_clusters(REPLY, {}))
    assert "$6.88" in html
    assert "$1.28" in html
    assert "$2.74" in html
    assert re.search(r'<tr data-cluster="gone">.*?unreachable', html)
    assert re.search(r'<tr data-cluster="aws">.*?refusing dispatches', html)
    assert EVIL not in html
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html
    assert "style=" not in html
    assert "<script" not in html


def test_roles_that_may_not_list_jobs_and_members_are_told_what_promised_counts() -> None:
    assert 'id="promised-hidden"' in render_clusters(build_clusters(REPLY, None))
    member = render_clusters(build_clusters(REPLY, {}, scope="vision"))
    assert 'id="promised-scope"' in member
    assert "vision" in member
