"""The simulated kubelet's process mode: a pod's main container runs its command as a local process.

For a real rendezvous in tests (`localExec: true` in a simulated cluster's config; off by default,
since it runs whatever a pod says with the simulator's own rights, which no shared cluster may do).
What a kubelet gives a container, the process gets:

* its environment: `value`s, `fieldRef`s (name, namespace, uid, labels, annotations, node, IPs), and
  `$(VAR)` references expanded in later values, in `command` and in `args`, as Kubernetes does;
* its files: `downwardAPI` volumes (the launcher's hostfile) are written where they are mounted;
* its name: the pod's `hostname`, and an `/etc/hosts` that resolves to loopback the pod itself and
  the pods of the same namespace and subdomain, as the cluster DNS answers for a headless Service.

Each process runs in its own mount and UTS namespaces (`unshare`, as root): `/etc` is an overlay
whose upper layer holds the pod's hosts file and mounted files, and the host name is the pod's. So
an unchanged launcher (gloo, gRPC, MPI) resolves `MASTER_ADDR` and reads `/etc/gpufed/hostfile`
as it would in a pod, and nothing outside the process sees either. A per-pod hosts mapping through
the environment was the other choice; it needs every launcher to read it, which real ones do not.
Volumes mounted outside `/etc` are not materialised (the process would see the host's path).

* its termination message: as a kubelet does, the file at the container's `terminationMessagePath`
  is created empty before the start and read when the process ends, at most
  `termination_message_limit` bytes of it (4096, less when the pod has more than three containers),
  into the container's terminated state's `message`. With `terminationMessagePolicy:
  FallbackToLogsOnError`, an empty file and a non-zero exit give the last 80 lines of the output
  instead, at most 2048 bytes of them. Only a path under `/etc` is read here (the overlay's upper
  layer is the pod's own); the default `/dev/termination-log`, and any other path, is the host's
  in this mode, so no message is read from it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

Obj = dict[str, Any]
log = structlog.get_logger("gpufed.clusters.sim.local_exec")

# `mount -t overlay` on /etc, the pod's host name, then the command: positional arguments keep the
# pod's environment exactly what its spec says.
_SETUP = (
    'mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc && hostname "$3" '
    '&& shift 3 && exec "$@"'
)
_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_PR_SET_PDEATHSIG = 1
# One process's output kept per line: a runaway line must not hold the simulator's memory.
_MAX_LINE = 64 * 1024

# The kubelet's limits on termination messages (Kubernetes, "Determine the Reason for Pod Failure"):
# at most 4096 bytes a container, and 12 KiB for all of a pod's containers, shared equally; the
# log's fallback at most 2048 bytes or 80 lines, whichever is smaller.
MAX_MESSAGE_BYTES = 4096
MAX_POD_MESSAGE_BYTES = 12 * 1024
FALLBACK_LOG_BYTES = 2048
FALLBACK_LOG_LINES = 80
DEFAULT_MESSAGE_PATH = "/dev/termination-log"

Output = Callable[[str, str, str], None]  # pod uid, container, line
Exited = Callable[[str, int, str], None]  # pod uid, exit code, termination message


def available() -> str | None:
    """None when processes can run in their own namespaces here, else why not."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    if os.geteuid() != 0:
        return "mount and UTS namespaces need root"
    return None


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: defined names are replaced, `$$` escapes, others stay."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _REF.sub(one, text)


def field_value(pod: Obj, path: str) -> str:
    """A `fieldRef` as the kubelet resolves it; "" for an annotation or label that is not there."""
    meta = pod.get("metadata") or {}
    keyed = re.fullmatch(r"metadata\.(annotations|labels)\['([^']*)'\]", path)
    if keyed:
        return str((meta.get(keyed.group(1)) or {}).get(keyed.group(2), ""))
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": (pod.get("spec") or {}).get("nodeName"),
        "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName"),
        "status.podIP": (pod.get("status") or {}).get("podIP"),
        "status.hostIP": (pod.get("status") or {}).get("hostIP"),
    }
    return str(simple.get(path) or "")


# A Secret's data by (namespace, name), decoded; None when there is no such Secret.
SecretData = Callable[[str, str], Mapping[str, str] | None]


def _no_secrets(namespace: str, name: str) -> None:
    return None


def container_env(pod: Obj, container: Obj, secret_data: SecretData = _no_secrets) -> dict[str, str]:
    """The container's variables in order; a later entry of the same name wins, as in a kubelet:
    `envFrom` first, then `env`. Secrets are read from the pod's namespace (a kubelet would refuse
    to start a container whose non-optional Secret is missing; here such a variable is left unset).
    ConfigMaps are not read by this mode."""
    namespace = str((pod.get("metadata") or {}).get("namespace", ""))
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        ref = source.get("secretRef")
        data = secret_data(namespace, str(ref.get("name", ""))) if ref else None
        for key, value in (data or {}).items():
            env[str(source.get("prefix") or "") + key] = value
    for item in container.get("env") or []:
        name = str(item.get("name", ""))
        value_from = item.get("valueFrom") or {}
        if "value" in item:
            env[name] = expand(str(item.get("value") or ""), env)
        elif "fieldRef" in value_from:
            env[name] = field_value(pod, str(value_from["fieldRef"].get("fieldPath", "")))
        elif "secretKeyRef" in value_from:
            ref = value_from["secretKeyRef"]
            found = (secret_data(namespace, str(ref.get("name", ""))) or {}).get(str(ref.get("key", "")))
            if found is not None:
                env[name] = found
    return env


def pod_host(pod: Obj) -> tuple[str, str | None]:
    spec = pod.get("spec") or {}
    return str(spec.get("hostname") or pod["metadata"]["name"]), spec.get("subdomain")


def hosts_file(pod: Obj, peers: list[Obj]) -> str:
    """Loopback for this pod's names and its subdomain peers' (same namespace), nothing else."""
    namespace = pod["metadata"].get("namespace", "")
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    _, own_subdomain = pod_host(pod)
    for other in [pod, *peers]:
        host, subdomain = pod_host(other)
        if other is not pod and (
            other["metadata"].get("namespace", "") != namespace
            or subdomain is None
            or subdomain != own_subdomain
        ):
            continue
        names = (
            [host]
            if subdomain is None
            else [f"{host}.{subdomain}.{namespace}.svc.cluster.local", f"{host}.{subdomain}"]
        )
        if other is pod:
            names.append(host)
        lines.append("127.0.0.1\t" + " ".join(dict.fromkeys(names)))
    return "\n".join(lines) + "\n"


def _mounted_files(pod: Obj, container: Obj) -> dict[str, str]:
    """Absolute path -> content of the downwardAPI files the container mounts under /etc."""
    volumes = {v.get("name"): v for v in (pod.get("spec") or {}).get("volumes") or []}
    files: dict[str, str] = {}
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount.get("name")) or {}
        target = str(mount.get("mountPath", "")).rstrip("/")
        if "downwardAPI" not in volume or not target.startswith("/etc/"):
            continue
        for item in volume["downwardAPI"].get("items") or []:
            ref = (item.get("fieldRef") or {}).get("fieldPath")
            if ref:
                files[f"{target}/{item.get('path')}"] = field_value(pod, str(ref))
    return files


def termination_message_limit(pod: Obj) -> int:
    """The most bytes of one container's termination message: 4096, or the pod's 12 KiB shared by
    all its containers (init containers too) when that is less, as the kubelet cuts them."""
    spec = pod.get("spec") or {}
    count = len(spec.get("containers") or []) + len(spec.get("initContainers") or [])
    return min(MAX_MESSAGE_BYTES, MAX_POD_MESSAGE_BYTES // max(1, count))


def message_file(upper: Path, container: Obj) -> Path | None:
    """Where, in the pod's /etc overlay, the process's termination message file is; None when its
    path is not under /etc (not readable in process mode) or leaves it."""
    path = str(container.get("terminationMessagePath") or DEFAULT_MESSAGE_PATH)
    if not path.startswith("/etc/") or ".." in path.split("/"):
        return None
    return upper / path.removeprefix("/etc/")


def _regular_file_in(file: Path, upper: Path) -> bool:
    """Whether `file` is a regular file of the pod's own /etc layer `upper`, reached without a link.
    The simulator reads it with its own rights on the host: a symbolic link the process made (of the
    file or of a directory above it) would otherwise hand it a host file, and a FIFO would block."""
    try:
        real = file.resolve(strict=True)
        return real == upper.resolve(strict=True) / file.relative_to(upper) and real.is_file()
    except (OSError, RuntimeError, ValueError):
        return False


def termination_message(
    file: Path | None, upper: Path, limit: int, *, policy: str, exit_code: int, last_lines: Sequence[str]
) -> str:
    """The container's terminated `message`: the first `limit` bytes of its message file (policy
    File, the default); with FallbackToLogsOnError, when the file is empty and the container failed,
    the end of its output (at most FALLBACK_LOG_LINES lines and FALLBACK_LOG_BYTES bytes)."""
    data = b""
    if file is not None and _regular_file_in(file, upper):
        with file.open("rb") as f:
            data = f.read(limit)
    if not data and policy == "FallbackToLogsOnError" and exit_code != 0:
        tail = "".join(line + "\n" for line in list(last_lines)[-FALLBACK_LOG_LINES:]).encode()
        data = tail[-min(limit, FALLBACK_LOG_BYTES) :]
    # The API holds text: a cut inside a UTF-8 sequence reads as U+FFFD, as it does from a kubelet.
    return data.decode("utf-8", "replace")


def _die_with_parent() -> None:
    # The processes must not outlive the simulator that ran them, however it ends.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass(frozen=True, slots=True)
class _Ending:
    """How the container's termination message is read when its process ends."""

    file: Path | None
    upper: Path
    limit: int
    policy: str


class LocalExec:
    """Runs pods' main containers as processes; reports their output lines and exit codes."""

    def __init__(
        self,
        on_output: Output,
        on_exit: Exited,
        root: Path | None = None,
        secret_data: SecretData = _no_secrets,
        on_drained: Callable[[str], None] | None = None,
    ) -> None:
        self._on_output = on_output
        self._on_exit = on_exit
        # A process's output read to its end: its run's log may close (`LogBook.drained`).
        self._on_drained = on_drained
        self._secret_data = secret_data
        self._root = root or Path(tempfile.mkdtemp(prefix="gpufed-sim-exec-"))
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Pods stopped before their process was spawned: it is killed as soon as it is.
        self._stopped: set[str] = set()

    def start(self, pod: Obj, peers: list[Obj]) -> None:
        """Start the pod's main container; its end is reported through `on_exit`."""
        uid = pod["metadata"]["uid"]
        container = ((pod.get("spec") or {}).get("containers") or [{}])[0]
        name = str(container.get("name", ""))
        if not container.get("command"):
            self._on_output(
                uid, name, "[sim] local exec needs the container's command (the image is not run)"
            )
            self._drained(uid)
            self._on_exit(uid, 127, "")
            return
        env = container_env(pod, container, self._secret_data)
        argv = [expand(str(w), env) for w in (container.get("command") or []) + (container.get("args") or [])]
        pod_dir = self._root / uid
        upper, work = pod_dir / "etc", pod_dir / "work"
        upper.mkdir(parents=True, exist_ok=True)
        work.mkdir(exist_ok=True)
        (upper / "hosts").write_text(hosts_file(pod, peers))
        host, _ = pod_host(pod)
        (upper / "hostname").write_text(host + "\n")
        for path, content in _mounted_files(pod, container).items():
            target = upper / path.removeprefix("/etc/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        message = message_file(upper, container)
        if message is not None and not message.exists():
            # The kubelet creates the file (empty) and mounts it before the container starts.
            message.parent.mkdir(parents=True, exist_ok=True)
            message.touch()
        ending = _Ending(
            message,
            upper,
            termination_message_limit(pod),
            str(container.get("terminationMessagePolicy") or "File"),
        )
        cwd = str(container.get("workingDir") or "")
        setup = [str(upper), str(work), host]
        task = asyncio.get_running_loop().create_task(
            self._run(
                uid, name, [*setup, *argv], env, cwd if cwd and Path(cwd).is_dir() else str(pod_dir), ending
            )
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _drained(self, uid: str) -> None:
        if self._on_drained is not None:
            self._on_drained(uid)

    def stop(self, uid: str) -> None:
        """Kill the pod's process (its whole process group): the pod was deleted or ended."""
        proc = self._procs.pop(uid, None)
        if proc is None:
            self._stopped.add(uid)
        elif proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    def stop_all(self) -> None:
        for uid in list(self._procs):
            self.stop(uid)

    async def _run(
        self, uid: str, name: str, args: list[str], env: dict[str, str], cwd: str, ending: _Ending
    ) -> None:
        try:
            proc = await asyncio.create_subprocess_exec(
                "unshare", "--mount", "--uts", "--fork", "--kill-child", "--",
                "/bin/sh", "-c", _SETUP, "local-pod", *args,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env},
                cwd=cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
                limit=_MAX_LINE,
            )  # fmt: skip
        except OSError as error:
            self._on_output(uid, name, f"[sim] local exec could not start: {error}")
            self._drained(uid)
            self._on_exit(uid, 128, "")
            return
        self._procs[uid] = proc
        if uid in self._stopped:
            self._stopped.discard(uid)
            self.stop(uid)
        log.info("sim_local_exec_started", uid=uid, pid=proc.pid)
        assert proc.stdout is not None
        last_lines: collections.deque[str] = collections.deque(maxlen=FALLBACK_LOG_LINES)
        while True:
            try:
                raw = await proc.stdout.readline()
            except ValueError:  # a line over the limit: drop what is buffered and go on
                raw = b"[sim] (a line over 64 KiB was cut)\n"
            if not raw:
                break
            line = raw.decode(errors="replace").rstrip("\n")
            last_lines.append(line)
            self._on_output(uid, name, line)
        code = await proc.wait()
        killed = self._procs.pop(uid, None) is None
        # A signal's death reads as 128 + the signal, as a container runtime reports it.
        code = code if code >= 0 else 128 - code
        message = ""
        if not killed:
            # Read before the pod's directory (and the file in its /etc) is removed.
            message = await asyncio.to_thread(
                termination_message,
                ending.file,
                ending.upper,
                ending.limit,
                policy=ending.policy,
                exit_code=code,
                last_lines=last_lines,
            )
        await asyncio.to_thread(shutil.rmtree, self._root / uid, True)
        self._drained(uid)  # before the exit is reported: the run has every line by then
        if not killed:
            self._on_exit(uid, code, message)
