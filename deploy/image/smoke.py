"""`make image-smoke`: start the image's `gpufed serve` and use it from outside, as a user would.

The server runs inside the image with `buildah run --isolation chroot` (podman cannot start containers
in this sandbox: they cannot set rlimits), through the image's own entrypoint, user and working
directory, against an etcd this script starts on loopback. From outside the image it then checks

* gRPC health says SERVING and the HTTP `/readyz` answers 200;
* a job submitted by a tenant's user runs to SUCCEEDED on the bootstrap config's simulated clusters,
  and a user of another tenant cannot see it;
* the server process runs as the image's fixed non-root UID (read from /proc, not from gpufed);
* the server wrote nothing to the image's root filesystem outside the paths docs/deploy.md names as
  writable, so it runs under a Pod's readOnlyRootFilesystem;
* the image's placer runs compiled (mypyc, built for the image's Python by deploy/image/build.sh) and
  plans the benchmark federation's eight cycles as the bytes recorded in
  tests/unit/data/placer_cycles_golden.json (the scenario's module is mounted in read-only; nothing of
  the tests is in the image).

It prints `image_size_mb: N MB`, exits non-zero on any failure, and stops and removes everything it
started (the etcd, the container, its temporary directories) either way.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc

from datasync.loopback_ports import free_ports
from federation.api.client import GpufedClient, wait_until_serving
from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess, etcdctl_binary

REPO = Path(__file__).resolve().parents[2]
# The e2e tests' federation: tenants, users and two simulated clusters (no kubeconfig: the server
# simulates them itself), so a job runs with nothing else started.
BOOTSTRAP = REPO / "tests" / "e2e" / "federation.yaml"
IMAGE_UID = 10001
# What a Pod with readOnlyRootFilesystem must mount writable (docs/deploy.md, "Image"): the working
# directory that holds the state dir, and /tmp. Buildah itself creates the rest of this list in the
# container (mount points, its resolver files).
WRITABLE = ("var/lib/gpufed", "tmp")
BUILDAH_STUBS = frozenset(
    {
        "etc",
        "etc/hosts",
        "etc/resolv.conf",
        "etc/hostname",
        "etc/gpufed",
        "run",
        "run/.containerenv",
        "var",
        "var/lib",
    }
)

MANIFEST = """\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata:
  name: image-smoke
  annotations:
    sim.gpufed.io/duration: "1s"
spec:
  gpuTypes: [A100]
  tasks:
    - {name: master, replicas: 1, image: "pytorch/pytorch:2.3", gpus: 1}
    - {name: worker, replicas: 1, image: "pytorch/pytorch:2.3", gpus: 1}
"""

TERMINAL = (pb.JOB_PHASE_SUCCEEDED, pb.JOB_PHASE_FAILED, pb.JOB_PHASE_CANCELLED)

T = TypeVar("T")


class SmokeFailed(Exception):
    pass


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float, alive: Callable[[], None]) -> T:
    """Poll `probe` until it returns a value; `alive` raises when the server has died meanwhile."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive()
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise SmokeFailed(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.2)


def buildah(*args: str) -> str:
    done = subprocess.run(["buildah", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SmokeFailed(f"buildah {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


@contextlib.contextmanager
def container(image: str) -> Iterator[str]:
    name = buildah("from", "--quiet", "--name", f"gpufed-smoke-{os.getpid()}", image)
    try:
        yield name
    finally:
        subprocess.run(["buildah", "rm", name], capture_output=True, check=False)


def processes_running(identity: str) -> list[int]:
    """The image's server processes, found by the unique identity in their command line; the
    `buildah run` wrapper's own command line carries it too, and is left out, as is its helper."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if identity.encode() in argv and b"serve" in argv and not argv[0].endswith(b"buildah"):
            with contextlib.suppress(OSError):
                # buildah's chroot helper (a memfd copy of buildah) carries the same command line
                # until it executes gpufed.
                if not (entry / "comm").read_text().startswith("memfd:"):
                    found.append(int(entry.name))
    return found


def ids_of(pid: int) -> tuple[list[int], list[int]]:
    """Real, effective, saved and filesystem UIDs and GIDs, from /proc."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return [int(x) for x in fields["Uid"].split()], [int(x) for x in fields["Gid"].split()]


def check_labels(labels: dict[str, str]) -> None:
    """The OCI labels name this project's version and a commit of this repository."""
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    if labels.get("org.opencontainers.image.version") != version:
        raise SmokeFailed(f"label version {labels.get('org.opencontainers.image.version')!r}, not {version}")
    revision = labels.get("org.opencontainers.image.revision", "")
    known = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{revision}^{{commit}}"], check=False)
    if len(revision) != 40 or known.returncode != 0:
        raise SmokeFailed(f"label revision {revision!r} is no commit of this repository")
    print(f"labels: version {version}, revision {revision}")


def stored_keys(endpoint: str) -> list[str]:
    """Every key in etcd, read by etcdctl: the independent judge that the image's server stored its
    state in the etcd this script started, and not in some other."""
    done = subprocess.run(
        [str(etcdctl_binary()), f"--endpoints={endpoint}", "get", "", "--prefix", "--keys-only"],
        capture_output=True,
        text=True,
        check=False,
        timeout=10,
    )
    if done.returncode != 0:
        raise SmokeFailed(f"etcdctl get: {done.stderr.strip()}")
    return [line for line in done.stdout.splitlines() if line]


def readyz(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            body: str = reply.read().decode()
            return body if reply.status == 200 else None
    except (urllib.error.URLError, OSError):
        return None


def root_writes(upper: Path) -> list[str]:
    """Paths the run added or changed in the container's own layer, outside the writable ones."""
    if not upper.is_dir():
        raise SmokeFailed(f"no container layer at {upper}: cannot tell what the server wrote")
    out = []
    for path in sorted(upper.rglob("*")):
        rel = path.relative_to(upper).as_posix()
        if rel in BUILDAH_STUBS or any(rel == w or rel.startswith(w + "/") for w in WRITABLE):
            continue
        out.append(rel)
    return out


def smoke(image: str, work: Path) -> None:
    grpc_port, http_port = free_ports(2)
    identity = f"image-smoke-{os.getpid()}"
    started = time.monotonic()
    with EtcdProcess(work / "etcd") as etcd, container(image) as ctr:
        config = json.loads(buildah("inspect", "--type", "container", ctr))["OCIv1"]["config"]
        entrypoint, workdir = config["Entrypoint"], config["WorkingDir"]
        print(f"entrypoint: {entrypoint}, user: {config['User']}, workdir: {workdir}")
        if config["User"].split(":")[0] != str(IMAGE_UID):
            raise SmokeFailed(f"the image's user is {config['User']!r}, not {IMAGE_UID}")
        check_labels(config.get("Labels") or {})
        if workdir in (config.get("Volumes") or {}):
            # buildah orders an image volume and a `-v` bind on one path by an unstable sort: the
            # state would sometimes land in an anonymous volume, not the host directory mounted here.
            raise SmokeFailed(f"the image declares {workdir} a VOLUME (see docs/deploy.md, 'Image')")
        rootfs = Path(buildah("mount", ctr))
        size_mb = int(subprocess.check_output(["du", "-sm", str(rootfs)], text=True).split()[0])
        print(f"image_size_mb: {size_mb} MB")
        upper = rootfs.parent / "diff"

        state = work / "state"
        state.mkdir(mode=0o750)
        os.chown(state, IMAGE_UID, IMAGE_UID)
        config_dir = work / "config"
        config_dir.mkdir()
        shutil.copy(BOOTSTRAP, config_dir / "federation.yaml")
        log_path = work / "server.log"
        argv = [
            "buildah", "run", "--isolation", "chroot",
            "-v", f"{state}:{workdir}",
            "-v", f"{config_dir}:/etc/gpufed:ro",
            ctr, "--", *entrypoint, "--state-dir", workdir,
            "serve", "--etcd", etcd.endpoint, "--port", str(grpc_port), "--metrics-port", str(http_port),
            "--bootstrap", "/etc/gpufed/federation.yaml", "--identity", identity,
        ]  # fmt: skip
        with log_path.open("wb") as log:
            # No stdin (CI has none): buildah then allocates no terminal.
            server = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:

            def alive() -> None:
                if server.poll() is not None:
                    tail = log_path.read_text(errors="replace")[-3000:]
                    raise SmokeFailed(f"the image's server exited ({server.returncode}):\n{tail}")

            target = f"127.0.0.1:{grpc_port}"

            def serving() -> bool | None:
                try:
                    wait_until_serving(target, timeout_s=1.0)
                except Exception:
                    return None
                return True

            wait_for("gRPC health SERVING", serving, 120, alive)
            print(f"grpc health: SERVING after {time.monotonic() - started:.1f} s")
            body = wait_for("/readyz 200", lambda: readyz(f"http://127.0.0.1:{http_port}/readyz"), 60, alive)
            print(f"readyz: 200 {body.strip()}")

            pids = wait_for("the server's process", lambda: processes_running(identity) or None, 10, alive)
            for pid in pids:
                uids, gids = ids_of(pid)
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                print(f"server pid {pid} ({comm}): uids {uids}, gids {gids}")
                if set(uids) != {IMAGE_UID} or set(gids) != {IMAGE_UID}:
                    raise SmokeFailed(f"server process {pid} runs as uids {uids}, gids {gids}")

            # The server wrote its users' tokens into the state dir (a host directory mounted in).
            tokens = state / "tokens"
            wait_for("the users' token files", lambda: (tokens / "bob.token").exists() or None, 10, alive)
            with (
                GpufedClient(target, (tokens / "alice.token").read_text().strip()) as alice,
                GpufedClient(target, (tokens / "bob.token").read_text().strip()) as bob,
            ):
                job_id = alice.submit(MANIFEST).job_id

                def finished() -> pb.JobPhase.ValueType | None:
                    phase = alice.get(job_id).phase
                    return phase if phase in TERMINAL else None

                phase = wait_for(f"job {job_id} finished", finished, 60, alive)
                if phase != pb.JOB_PHASE_SUCCEEDED:
                    raise SmokeFailed(f"job {job_id} ended {pb.JobPhase.Name(phase)}")
                print(f"job {job_id}: SUCCEEDED")
                stored = stored_keys(etcd.endpoint)
                if not any(key.endswith(f"jobs/{job_id}") for key in stored):
                    raise SmokeFailed(f"etcdctl finds no key of job {job_id} in the smoke's etcd")
                print(f"etcdctl: job {job_id} stored in the smoke's etcd ({len(stored)} keys)")
                try:
                    bob.get(job_id)
                except grpc.RpcError as refused:
                    print(f"another tenant's get: {refused.code().name}")
                else:
                    raise SmokeFailed(f"bob (tenant nlp) read alice's job {job_id}")
        finally:
            stop(server, identity)
        written = root_writes(upper)
        if written:
            raise SmokeFailed(f"the server wrote to the image's root filesystem: {written[:20]}")
        print(f"root filesystem: nothing written outside {', '.join('/' + w for w in WRITABLE)}")


GOLDEN = REPO / "tests" / "unit" / "data" / "placer_cycles_golden.json"
# The recorded cycles as tests/unit/plan_cycles.bench_cycles makes them (3,000 gangs, 8 cycles).
PLACER_CHECK = """
import json, random, sys
sys.path.insert(0, "/check")
import placement, placement.plan
from bench.placer_scenario import NOW, advance, build, digest
snapshot, now, rng, digests = build(gangs=3000), NOW, random.Random(1), []
for _ in range(8):
    decided = placement.plan.plan(snapshot, now=now)
    digests.append(digest(decided))
    snapshot, now = advance(snapshot, decided, now, rng, churn=20)
print(json.dumps({"compiled": placement.COMPILED, "module": placement.plan.__file__, "digests": digests}))
"""


def check_placer(image: str) -> None:
    """The image's placer is the compiled build of its own sources, and plans the recorded bytes."""
    with container(image) as ctr:
        argv = ["run", "--isolation", "chroot", "-v", f"{REPO / 'bench'}:/check/bench:ro", ctr, "--"]
        out = json.loads(buildah(*argv, "/opt/gpufed/bin/python", "-c", PLACER_CHECK).splitlines()[-1])
    if not out["compiled"]:
        raise SmokeFailed(f"the image's placer runs interpreted ({out['module']})")
    if out["digests"] != json.loads(GOLDEN.read_text())["bench_3000x8"]:
        raise SmokeFailed("the image's compiled placer planned other bytes than the recorded cycles")
    print(f"placer: compiled ({out['module']}), 8 cycles the recorded bytes")


def stop(server: subprocess.Popen[bytes], identity: str) -> None:
    """SIGTERM to `buildah run`'s session, then to the server itself if it outlived it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    for pid in processes_running(identity):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def main() -> int:
    image = sys.argv[1] if len(sys.argv) > 1 else "localhost/gpufed:latest"
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="gpufed-image-smoke-"))
    try:
        check_placer(image)
        smoke(image, work)
    except (SmokeFailed, grpc.RpcError, OSError) as failed:
        log = work / "server.log"
        if log.exists():
            print(
                f"--- the server's log (tail) ---\n{log.read_text(errors='replace')[-4000:]}", file=sys.stderr
            )
        print(f"image smoke FAILED: {failed}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"image smoke passed in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
