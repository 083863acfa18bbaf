"""What an API worker of `gpufed serve --api-workers` runs (federation.runtime.api_workers): an `api`
server on its server's port, with a state dir of its own but the server's secrets key and history."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from federation.errors import InvalidSpec
from federation.history.config import HistorySettings
from federation.history.engine import default_dsn
from federation.runtime.api_workers import (
    HEALTHY_RUN_S,
    RESTART_MIN_S,
    ApiWorkers,
    _Worker,
    check_worker_count,
    worker_config,
)
from federation.runtime.role import ServerRole
from federation.runtime.server import ServerConfig
from federation.secrets.keyfile import ENV_VAR as SECRETS_KEY_ENV
from federation.secrets.keyfile import FILE_NAME as SECRETS_KEY_FILE


def test_a_worker_serves_the_api_on_the_servers_port_with_its_key_and_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SECRETS_KEY_ENV, raising=False)
    (tmp_path / SECRETS_KEY_FILE).write_text("k")
    server = ServerConfig(etcd_endpoint="http://e", state_dir=tmp_path, metrics_port=9100, identity="s1")
    worker = worker_config(server, 50051, 1)
    assert worker.role is ServerRole.API
    assert (worker.grpc_port, worker.grpc_reuse_port, worker.metrics_port) == (50051, True, None)
    assert worker.identity == "s1-api1"
    assert worker.state_dir == tmp_path.resolve() / "api-workers" / "1"
    # What the server reads and archives into, not files of the worker's own empty state dir.
    assert worker.secrets_key_file == (tmp_path / SECRETS_KEY_FILE).resolve()
    assert worker.history.dsn == default_dsn(tmp_path.resolve())


def test_a_workers_history_and_key_given_elsewhere_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRETS_KEY_ENV, str(tmp_path / "elsewhere.key"))
    history = HistorySettings(dsn_env="GPUFED_HISTORY_DSN")
    server = ServerConfig(etcd_endpoint="http://e", state_dir=tmp_path, history=history)
    worker = worker_config(server, 1, 0)
    assert worker.secrets_key_file is None  # the environment, inherited, names it
    assert worker.history == history


def test_the_worker_count_is_bounded() -> None:
    assert check_worker_count(0) == 0
    with pytest.raises(InvalidSpec, match="--api-workers"):
        check_worker_count(-1)
    with pytest.raises(InvalidSpec, match="--api-workers"):
        check_worker_count(65)


class _Exited:
    """A worker process that has exited (what `_tend` reads of a Popen)."""

    pid = 4242
    returncode = 1

    def poll(self) -> int:
        return 1


def test_a_worker_that_keeps_dying_is_restarted_after_doubling_pauses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = ServerConfig(etcd_endpoint="http://e", state_dir=tmp_path)
    workers = ApiWorkers(server, 50051, 1)
    spawned: list[float] = []

    def spawn(worker: _Worker, now: float) -> None:
        spawned.append(now)
        worker.process = _Exited()  # type: ignore[assignment]
        worker.started_at = now
        worker.restart_at = None

    monkeypatch.setattr(workers, "_spawn", spawn)
    workers._spawn(workers._workers[0], 0.0)
    now = 0.0
    while len(spawned) < 8 and now < 1000:
        workers._tend(now)
        now += 0.5
    # Dying at once each time: pauses of 1, 2, 4, 8, 16 s, then the bound, each after the look
    # (every 0.5 s here) that found the worker gone; the very first look found it at once.
    pauses = [b - a for a, b in itertools.pairwise(spawned)]
    assert pauses == [1.0, 2.5, 4.5, 8.5, 16.5, 30.5, 30.5]

    # One that ran long enough before it died is started again after the shortest pause, however
    # often it failed before that run.
    worker = workers._workers[0]
    spawn(worker, 1000.0)
    worker.pause_s = 16.0
    workers._tend(1000.0 + HEALTHY_RUN_S)
    assert worker.restart_at == 1000.0 + HEALTHY_RUN_S + RESTART_MIN_S
    assert worker.pause_s == 2 * RESTART_MIN_S
