"""What an API worker of `gpufed serve --api-workers` runs (federation.runtime.api_workers): an `api`
server on its server's port, with a state dir of its own but the server's secrets key and history."""

from __future__ import annotations

from pathlib import Path

import pytest

from federation.errors import InvalidSpec
from federation.history.config import HistorySettings
from federation.history.engine import default_dsn
from federation.runtime.api_workers import check_worker_count, worker_config
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
