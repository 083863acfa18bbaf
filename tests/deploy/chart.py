"""The Helm chart's tools and renders, shared by the chart's tests: the real helm binary and
kubernetes-validate that `make deploy-tools` installs (run here too, so a bare `pytest` finds them;
it does nothing when they are there), and `helm template` of the chart with an example's values."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "gpufed"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
HELM = REPO / ".tools" / "helm-3.17.2" / "helm"
KUBE_VALIDATE_PYTHON = REPO / ".venv-kubevalidate" / "bin" / "python"
CHECKOV = REPO / ".venv-checkov" / "bin" / "checkov"
DEPLOY_DOC = REPO / "docs" / "deploy.md"
NAMESPACE = "gpufed"
RELEASE = "gpufed"


def ensure_tools(*targets: str) -> None:
    """`make` the tools (idempotent: stamp files), so that the tests run from a bare `pytest` too."""
    # Not the jobserver of a `make test` this runs under: the nested make is a make of its own.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    result = subprocess.run(
        ["make", "--no-print-directory", "-s", *targets],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, f"make {' '.join(targets)} failed:\n{result.stdout}\n{result.stderr}"


@dataclass(frozen=True, slots=True)
class Render:
    code: int
    stdout: str
    stderr: str

    @property
    def docs(self) -> list[dict[str, Any]]:
        assert self.code == 0, self.stderr
        return [doc for doc in yaml.safe_load_all(self.stdout) if doc]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [
            d for d in self.docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
        ]
        assert len(found) == 1, f"{len(found)} {kind} {name or ''} in the render"
        return found[0]

    def kinds(self) -> list[tuple[str, str]]:
        return sorted((d["kind"], d["metadata"]["name"]) for d in self.docs)


def helm(*args: str, timeout_s: float = 30) -> Render:
    result = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=timeout_s)
    return Render(result.returncode, result.stdout, result.stderr)


def template(*values_files: Path, sets: tuple[str, ...] = (), kube_version: str | None = None) -> Render:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for path in values_files:
        args += ["-f", str(path)]
    for item in sets:
        args += ["--set", item]
    if kube_version is not None:
        args += ["--kube-version", kube_version]
    return helm(*args)


def pod_specs(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(workload name, pod spec) of every Deployment and StatefulSet."""
    return [
        (d["metadata"]["name"], d["spec"]["template"]["spec"])
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
    ]


def documented_block(name: str) -> Any:
    """The YAML block under `<!-- chart: NAME -->` in docs/deploy.md: what the docs promise."""
    text = DEPLOY_DOC.read_text()
    marker = f"<!-- chart: {name} -->"
    assert marker in text, f"docs/deploy.md has no {marker}"
    after = text.split(marker, 1)[1]
    block = after.split("```yaml\n", 1)[1].split("```", 1)[0]
    return yaml.safe_load(block)


@dataclass
class Pod:
    """One server pod of a render, its container run here as the kubelet would run it."""

    name: str
    process: subprocess.Popen[bytes]
    grpc_port: int
    http_port: int
    state_dir: Path
    log: Path

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_pod(
    render: Render,
    *,
    name: str,
    etcd: str,
    work: Path,
    secrets: dict[tuple[str, str], str] | None = None,
    deployment: str | None = None,
) -> Pod:
    """Start the Deployment's container: its command and arguments with the pod's mounts mapped onto
    local paths (the ConfigMap's file, the state volume), the etcd and ports onto local ones, and its
    environment as the kubelet builds it (`$(POD_NAME)` expanded, `secretKeyRef`s read from
    `secrets`, keyed by Secret name and key). `deployment` names which, where the render has two
    (`scheduler.separate`)."""
    from datasync.loopback_ports import free_port

    container = render.one("Deployment", deployment)["spec"]["template"]["spec"]["containers"][0]
    config_map = render.one("ConfigMap")
    root = work / name
    bootstrap_in_pod = Path(
        next(a for a in container["args"] if a.startswith("--bootstrap=")).split("=", 1)[1]
    )
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    # The file the server reads is a key of the ConfigMap mounted where the argument says.
    assert str(bootstrap_in_pod.parent) == mount["mountPath"]
    bootstrap = root / "config" / bootstrap_in_pod.name
    bootstrap.parent.mkdir(parents=True)
    bootstrap.write_text(config_map["data"][bootstrap_in_pod.name])
    grpc_port, http_port = free_port(), free_port()
    assert {p["name"] for p in container["ports"]} == {"grpc", "http"}
    state_dir = root / "state"
    local = {
        "--etcd": etcd,
        "--state-dir": str(state_dir),
        "--bootstrap": str(bootstrap),
        "--port": str(grpc_port),
        "--metrics-port": str(http_port),
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFED_")}
    for item in container.get("env", []):
        source = item.get("valueFrom", {})
        if "value" in item:
            env[item["name"]] = item["value"]
        elif source.get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[item["name"]] = name
        else:
            ref = source["secretKeyRef"]
            env[item["name"]] = (secrets or {})[(ref["name"], ref["key"])]
    argv = []
    for arg in container["args"]:
        flag, _, value = arg.partition("=")
        if value:
            # The kubelet expands $(VAR) from the container's env.
            value = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], local.get(flag, value))
            argv.append(f"{flag}={value}")
        else:
            argv.append(arg)
    # The image's entrypoint, `gpufed`, is the console script beside this interpreter here.
    command = [str(Path(sys.executable).with_name(container["command"][0]))]
    log = root / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen([*command, *argv], stdout=out, stderr=subprocess.STDOUT, env=env)
    return Pod(name, process, grpc_port, http_port, state_dir, log)


def readyz(host: str, port: int) -> int:
    """/readyz's status code as the kubelet's probe gets it (0: no answer)."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/readyz", timeout=2) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0
