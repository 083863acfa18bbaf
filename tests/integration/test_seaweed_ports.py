"""A `weed mini` whose freshly drawn port is taken before it binds (a neighbouring test worker's server
drew the same one, say) starts on the next draw instead of failing: weed reports that race as "Port
allocation failed", not as a bind error (CI of stop 37 lost a worker's whole datasync tier to it)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from datasync import seaweed_process
from datasync.seaweed_process import SeaweedProcess

pytestmark = pytest.mark.integration


def test_a_port_taken_between_the_draw_and_the_bind_is_drawn_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_draw = seaweed_process.free_port_pairs
    draws: list[list[int]] = []
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]

        def draw(count: int, host: str = "127.0.0.1") -> list[int]:
            pairs = real_draw(count, host)
            if not draws:
                pairs[2] = taken  # the filer's port, as weed's own error in that CI named it
            draws.append(pairs)
            return pairs

        monkeypatch.setattr(seaweed_process, "free_port_pairs", draw)
        with SeaweedProcess(tmp_path / "weed", buckets=["ports"]) as weed:
            assert weed.running
            assert weed.endpoint is not None
            assert len(draws) == 2, draws
            assert taken not in draws[1]
            log = (tmp_path / "weed" / "weed.log").read_text(errors="replace")
            assert f"port {taken}" in log


def test_a_restart_keeps_its_s3_endpoint_when_another_components_port_was_taken(tmp_path: Path) -> None:
    """`gpufed up` after a crash keeps its object stores' endpoints (tests/e2e/test_up_crash.py): a
    restart redraws only the ports another process took meanwhile. It redrew all ten when any one
    was taken, and the S3 endpoint that clients and stores.json know moved (a loaded fresh-clone
    run: one of the crashed run's ports had gone to a neighbouring test's server)."""
    data_dir = tmp_path / "weed"
    with SeaweedProcess(data_dir, buckets=["ports"]) as weed:
        endpoint = weed.endpoint
        filer_port = weed.ports["filer"]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", filer_port))
        squatter.listen()
        with SeaweedProcess(data_dir, buckets=["ports"]) as again:
            assert again.endpoint == endpoint
            assert again.ports["filer"] != filer_port
