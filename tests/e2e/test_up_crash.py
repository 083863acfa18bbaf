"""`gpufed up` SIGKILLed (issue 15, point 8): its children die with it, the next start on the same state
dir clears what a crash left, keeps the endpoints, and finishes a dataset sync cut off mid-way.

Driven as a user drives it: `python -m federation up` as a process of its own, the datasets API over
gRPC, the object stores through their S3 endpoints. rclone (`.venv/bin/rclone check --checksum`) is the
independent judge of the finished copy; /proc is the judge of what is still running.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from datasync import open_store
from datasync.seaweed_process import SeaweedProcess
from datasync.store_config import S3StoreConfig
from federation.api.client import GpufedClient, wait_until_serving
from federation.api.datasets_client import DatasetsClient
from federation.runtime.embedded import default_config_path, read_endpoint
from tests.e2e.harness import wait_for
from tests.etcdctl import lease_alive, leases_of

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024
KIB = 1024
HOME, CACHE = "onprem-s3", "s3-us-east-1"
# Objects below the multipart threshold, so that every one has an MD5 ETag and `rclone check
# --checksum` compares them all. The sync is paced by `datasync.maxBytesPerSecond` (set through the
# config, as an operator would) rather than by the data's size: 12 MiB at 4 MiB/s is about 3 s of
# copying on any machine, long enough to be caught running (half a second at least, under half done).
# A 96 MiB dataset paced by the machine alone made this the suite's slowest test (21 to 30 s).
OBJECTS, OBJECT_BYTES = 48, 256 * KIB
SYNC_BYTES_PER_S = 4 * MIB
# The lease of a copy's fence (`datasync.fenceTtlSeconds`, 30 s by default). The crashed run's sync
# held its copy's fence until the lease expired (etcd, restarted with the next start, counts the whole
# TTL again), so the next start's sync waited that long; the next start now revokes the dead run's
# leases (`embedded.release_leases_of_a_dead_run`), which the test checks. Should that fail, a short
# TTL keeps the wait short rather than the test slow. Long enough that the keepalives (every TTL / 6)
# survive a busy machine; a lost fence only defers a sync.
SHORT_FENCE_TTL_S = 6


def processes_mentioning(text: str) -> dict[int, str]:
    """Live (not zombie) processes whose command line names `text`, other than this one."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        cmdline = raw.replace(b"\0", b" ").decode(errors="replace")
        if text in cmdline:
            found[int(entry.name)] = cmdline
    return found


class Up:
    """`gpufed up` on `state_dir`, started again and again; stderr of each start kept apart. With
    `config`, that federation config instead of the embedded default."""

    def __init__(self, state_dir: Path, config: Path | None = None) -> None:
        self.state_dir = state_dir
        self.config = config
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def stderr_path(self) -> Path:
        return self.state_dir.parent / f"up-{self.starts}.log"

    @property
    def stdout_path(self) -> Path:
        return self.state_dir.parent / f"up-{self.starts}.out"

    def spawn(self) -> subprocess.Popen[bytes]:
        self.starts += 1
        config = ["--config", str(self.config)] if self.config is not None else []
        with self.stderr_path.open("w") as stderr, self.stdout_path.open("w") as stdout:
            return subprocess.Popen(
                [sys.executable, "-m", "federation", "--state-dir", str(self.state_dir), "up",
                 *config, "--port", "0", "--metrics-port", "0"],
                stdout=stdout, stderr=stderr, start_new_session=True,
            )  # fmt: skip

    def start(self) -> None:
        self.begin()
        self.wait_up()

    def begin(self) -> None:
        """Spawn `gpufed up` and return at once; `wait_up` waits until it serves."""
        self.proc = self.spawn()

    def wait_up(self) -> None:
        proc = self.proc
        assert proc is not None
        # Not the endpoint file: a SIGKILLed run leaves its own behind until the next one starts.
        wait_for(
            lambda: "gpufed is up" in self.stdout_path.read_text() or proc.poll() is not None, timeout_s=90
        )
        assert proc.poll() is None, self.stderr_path.read_text()[-3000:]
        wait_until_serving(read_endpoint(self.state_dir)["grpc"])

    def wait_stores(self) -> None:
        """Wait until the object stores serve, while the rest of `gpufed up` may still be starting: it
        writes `stores.json` once every store answers. Only for a first start (a SIGKILLed run leaves
        its `stores.json` behind)."""
        proc = self.proc
        assert proc is not None

        def written() -> bool:
            try:
                self.stores()
            except (OSError, ValueError):  # not there yet, or not all written yet
                return False
            return True

        wait_for(lambda: written() or proc.poll() is not None, timeout_s=90)
        assert proc.poll() is None, self.stderr_path.read_text()[-3000:]

    def sigkill(self) -> None:
        """SIGKILL gpufed up alone (not its process group): its children must go by themselves."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def client(self, user: str) -> GpufedClient:
        token = (self.state_dir / "tokens" / f"{user}.token").read_text().strip()
        return GpufedClient(read_endpoint(self.state_dir)["grpc"], token)

    def stores(self) -> dict[str, dict[str, str]]:
        stores: dict[str, dict[str, str]] = json.loads((self.state_dir / "stores.json").read_text())
        return stores

    def endpoints(self) -> dict[str, str]:
        """What clients of this state dir connect to, apart from the gRPC port `--port 0` leaves free."""
        stores = {name: where["endpoint"] for name, where in self.stores().items()}
        return {"etcd": read_endpoint(self.state_dir)["etcd"], **stores}


def _stopped(instance: Up) -> None:
    instance.stop()
    # Whatever a test left running on purpose (a survivor, a stand-in) goes too.
    for pid in processes_mentioning(str(instance.state_dir)):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    """`gpufed up` with the embedded default, as a user starts it, serving."""
    instance = Up(tmp_path / "state")
    instance.start()
    yield instance
    _stopped(instance)


@pytest.fixture
def starting_up_with_short_fences(tmp_path: Path) -> Iterator[Up]:
    """`gpufed up` with the embedded default's federation, its copy fences' lease shortened to
    `SHORT_FENCE_TTL_S` and its syncs paced at `SYNC_BYTES_PER_S` (the settings changed, through the
    config as an operator would); spawned but not yet serving (`Up.wait_stores`, `Up.wait_up`)."""
    federation = yaml.safe_load(default_config_path().read_text())
    federation["datasync"] = {
        **federation.get("datasync", {}),
        "fenceTtlSeconds": SHORT_FENCE_TTL_S,
        "maxBytesPerSecond": SYNC_BYTES_PER_S,
    }
    config = tmp_path / "federation.yaml"
    config.write_text(yaml.safe_dump(federation, sort_keys=False))
    instance = Up(tmp_path / "state", config)
    instance.begin()
    yield instance
    _stopped(instance)


def _put_dataset(up: Up, prefix: str) -> None:
    where = up.stores()[HOME]
    secret = SeaweedProcess(Path(where["seaweed_dir"])).secret_access_key
    config = S3StoreConfig(
        where["bucket"], endpoint=where["endpoint"], region="us-east-1",
        access_key_id_env="K", secret_access_key_env="S",
    )  # fmt: skip

    async def run() -> None:
        store = open_store(HOME, config, env={"K": "gpufed", "S": secret})
        slots = asyncio.Semaphore(4)

        async def one(i: int) -> None:
            async with slots:
                await store.put(f"{prefix}part-{i:03d}.bin", os.urandom(OBJECT_BYTES))

        await asyncio.gather(*(one(i) for i in range(OBJECTS)))
        await store.close()

    asyncio.run(run())


def _rclone(up: Up, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    for remote, name in (("HOME", HOME), ("CACHE", CACHE)):
        where = up.stores()[name]
        prefix = f"RCLONE_CONFIG_{remote}_"
        env |= {
            prefix + "TYPE": "s3",
            prefix + "PROVIDER": "SeaweedFS",
            prefix + "ENDPOINT": where["endpoint"],
            prefix + "ACCESS_KEY_ID": "gpufed",
            prefix + "SECRET_ACCESS_KEY": SeaweedProcess(Path(where["seaweed_dir"])).secret_access_key,
            prefix + "REGION": "us-east-1",
        }
    rclone = Path(sys.executable).parent / "rclone"
    return subprocess.run([str(rclone), *args], env=env, capture_output=True, text=True, timeout=300)


def _cache_prefix(up: Up) -> str:
    """Where the copy lives in the cache bucket, found by listing it rather than by assuming a layout."""
    bucket = up.stores()[CACHE]["bucket"]
    listed = _rclone(up, "lsf", "-R", "--files-only", f"cache:{bucket}")
    assert listed.returncode == 0, listed.stderr[-2000:]
    (path,) = [p for p in listed.stdout.splitlines() if p.endswith("part-000.bin")]
    return f"{bucket}/{path.removesuffix('part-000.bin')}"


def test_sigkill_mid_sync_leaves_nothing_running_and_the_next_start_finishes_the_sync(
    starting_up_with_short_fences: Up,
) -> None:
    up = starting_up_with_short_fences
    home_prefix = "vision/crashy/v1/"
    # The dataset goes into the private store as soon as it serves, while etcd, the simulator and the
    # server are still starting: the upload (seconds of it) needs none of them.
    up.wait_stores()
    _put_dataset(up, home_prefix)
    up.wait_up()
    total = OBJECTS * OBJECT_BYTES
    with up.client("alice") as alice:
        datasets = DatasetsClient(alice)
        registered = datasets.register("crashy", "v1", store=HOME, prefix=home_prefix)
        assert registered.size_bytes == total
        datasets.sync("crashy", store=CACHE)

        # Mid-sync: running for half a second (objects in flight, some perhaps already written) and
        # not half done. Progress counts whole objects and is written once a second, while 32 of the
        # 48 objects are in flight at once: "some bytes done but under half" is often never seen.
        running_since: list[float] = []

        def mid_way() -> bool:
            syncs = datasets.status("crashy", store=CACHE).syncs
            if not syncs or syncs[0].state != "running" or syncs[0].progress.bytes_done >= total // 2:
                return False
            running_since[:] = running_since or [time.monotonic()]
            return time.monotonic() - running_since[0] >= 0.5

        wait_for(mid_way, timeout_s=60, interval_s=0.05)
    before = up.endpoints()
    # The crashed run's leadership and its sync's copy fence, as etcd holds them.
    crashed_leases = leases_of(before["etcd"], "/gpufed/leader") | leases_of(
        before["etcd"], "/gpufed/copy-fences/"
    )
    assert len(crashed_leases) == 2, crashed_leases
    children = set(processes_mentioning(str(up.state_dir))) - {up.proc.pid if up.proc else 0}
    assert len(children) >= 4, "expected etcd, two weed and the simulator"
    up.sigkill()

    # The kernel kills every child with its parent: nothing of the crashed run holds a lock or a port.
    wait_for(lambda: not processes_mentioning(str(up.state_dir)), timeout_s=10, interval_s=0.05)

    up.start()
    assert up.endpoints() == before
    # The next start revoked them (the state dir's lock says their run is dead) instead of waiting
    # out their TTLs: 5 s before it could lead, and the fence's whole TTL before the sync resumed.
    assert [key for key, lease in crashed_leases.items() if lease_alive(before["etcd"], lease)] == []
    with up.client("alice") as alice:
        datasets = DatasetsClient(alice)

        def finished() -> bool:
            (sync,) = datasets.status("crashy", store=CACHE).syncs
            assert sync.state != "failed", sync.error
            return sync.state == "done"

        wait_for(finished, timeout_s=180, interval_s=0.3)
        (sync,) = datasets.status("crashy", store=CACHE).syncs
        assert sync.verified
    checked = _rclone(
        up, "check", "--checksum", "--one-way", "--exclude", ".gpufed/**",
        f"home:{up.stores()[HOME]['bucket']}/{home_prefix}", f"cache:{_cache_prefix(up)}",
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert f"{OBJECTS} matching files" in checked.stderr, checked.stderr[-3000:]
    assert "0 differences found" in checked.stderr, checked.stderr[-3000:]


def test_a_start_clears_a_survivor_of_a_crash_by_its_pid_file_and_spares_a_reused_pid(up: Up) -> None:
    sd = up.state_dir
    up.sigkill()
    wait_for(lambda: not processes_mentioning(str(sd)), timeout_s=10, interval_s=0.05)
    # A child that outlived the crash (its pid file names it, and it still runs that command) ...
    etcd_pid_file = sd / "etcd" / "etcd.pid"
    command = json.loads(etcd_pid_file.read_text())["command"]
    survivor = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    etcd_pid_file.write_text(json.dumps({"pid": survivor.pid, "command": command}))
    # ... and a pid file whose pid now belongs to an unrelated process.
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    weed_pid_file = sd / "seaweed" / "onprem" / "weed.pid"
    recorded = json.loads(weed_pid_file.read_text())["command"]
    weed_pid_file.write_text(json.dumps({"pid": stranger.pid, "command": recorded}))
    try:
        up.start()
        survivor.wait(timeout=10)
        assert stranger.poll() is None, "a process that merely reused a recorded pid was signalled"
        stderr = up.stderr_path.read_text()
        cleared = [line for line in stderr.splitlines() if "leftover_process_cleared" in line]
        assert len(cleared) == 1, stderr[-3000:]
        assert str(survivor.pid) in cleared[0]
        assert "etcd.pid" in cleared[0]
        with up.client("alice") as alice:
            assert alice.list_all() == []
    finally:
        stranger.kill()
        stranger.wait()
        if survivor.poll() is None:
            survivor.kill()
            survivor.wait()


def test_a_second_up_on_a_live_state_dir_is_refused_and_touches_nothing(up: Up) -> None:
    running = processes_mentioning(str(up.state_dir))
    second = up.spawn()
    assert second.wait(timeout=60) == 1
    stderr = up.stderr_path.read_text()
    assert up.proc is not None
    assert f"another gpufed up (pid {up.proc.pid}) is running" in stderr
    assert "Traceback" not in stderr
    # A negative check, so no condition to poll for: the refused start has exited, and a process it had
    # signalled would be gone within this (a SIGTERMed child needs a moment to exit).
    time.sleep(0.5)
    assert set(processes_mentioning(str(up.state_dir))) >= set(running)
    wait_until_serving(read_endpoint(up.state_dir)["grpc"])
