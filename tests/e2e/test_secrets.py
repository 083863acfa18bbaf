"""End to end: a tenant's secret reaches its job's pods on a member cluster and nowhere else.

The judges are independent of gpufed: etcdctl reads every key and value etcd holds, kubectl reads
the member clusters (the Secret while the job runs, the pods' references to it, and its absence
after), the server's own log file, the console's HTML as a browser gets it, and the gRPC replies
another tenant gets. Two clusters: `onprem` runs gangs as Volcano Jobs, `plain` (no Volcano) as
Indexed Jobs; a job is pinned to one with `spec.placement.clusters`.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from datasync.loopback_ports import free_port
from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from federation.secrets.keyfile import create_key_file
from tests.e2e.harness import ServerProcess, run_cli, wait_for
from tests.e2e.kube import a100_pool, gang_pods, job_of, onprem_a100, sim_kubectl, write_config
from tests.etcdctl import etcdctl

KUBECTL = shutil.which(
    "kubectl", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
)
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed"),
]

CLUSTERS: list[dict[str, Any]] = [
    onprem_a100(nodes=1),
    {"name": "plain", "provider": "private", "region": "dc2", "volcano": False, "pools": [a100_pool(1)]},
]
# Fresh per test run, so that a hit anywhere can only be this run's leak.
TOKEN = f"hf_{secrets.token_hex(16)}"
PASSWORD = f"pw-{secrets.token_hex(12)}"


def _job(name: str, cluster: str, duration: str, task: str) -> str:
    return f"""\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata:
  name: {name}
  annotations: {{sim.gpufed.io/duration: "{duration}"}}
spec:
  gpuTypes: [A100]
  placement: {{clusters: [{cluster}]}}
  tasks:
{task}"""


# Every form a template may use: env from one key, every key as env (with a prefix), and files.
TEMPLATED = _job(
    "tuned",
    "onprem",
    "300s",
    """\
    - name: trainer
      replicas: 1
      gpus: 1
      template:
        spec:
          containers:
            - name: trainer
              image: ghcr.io/example/train:1
              command: [python, train.py]
              env: [{name: HF_TOKEN, valueFrom: {secretKeyRef: {name: hf, key: token}}}]
              envFrom: [{secretRef: {name: tracker}, prefix: WANDB_}]
              volumeMounts: [{name: creds, mountPath: /etc/creds, readOnly: true}]
          volumes:
            - name: creds
              secret: {secretName: tracker}
""",
)
# The short form, on the cluster without Volcano, ending on its own.
SHORT = _job(
    "short",
    "plain",
    "1s",
    """\
    - name: main
      replicas: 2
      gpus: 1
      image: ghcr.io/example/train:1
      command: [python, train.py]
      secretEnv: [{name: HF_TOKEN, secret: hf, key: token}]
""",
)


def _refers(name: str) -> str:
    return _job(
        "probe",
        "onprem",
        "1s",
        f"""\
    - name: main
      replicas: 1
      gpus: 1
      image: busybox
      secretEnv: [{{name: TOKEN, secret: {name}, key: token}}]
""",
    )


@contextmanager
def secrets_server(
    etcd: EtcdProcess, sims: SimProcess, tmp_path: Path, clusters: list[dict[str, Any]], **config: Any
) -> Iterator[ServerProcess]:
    """`gpufed serve` on the simulator's `clusters` with a secrets key file and a console port."""
    path = write_config(tmp_path / "federation.yaml", sims, clusters, grace_s=8, **config)
    state = tmp_path / "state"
    # As `gpufed up` makes it: beside the state, never in etcd.
    create_key_file(state / "secrets.key")
    process = ServerProcess(
        etcd.endpoint, state, config=path, extra_args=("--metrics-port", str(free_port()))
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def fed(etcd: EtcdProcess, sims: SimProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    with secrets_server(
        etcd,
        sims,
        tmp_path,
        CLUSTERS,
        tenants=[{"name": "platform"}, {"name": "vision"}, {"name": "nlp"}],
        users=[
            {"name": "admin", "tenant": "platform", "role": "admin"},
            {"name": "alice", "tenant": "vision"},
            {"name": "bob", "tenant": "nlp"},
        ],
    ) as process:
        yield process


def kubectl(sims: SimProcess, cluster: str, *args: str) -> subprocess.CompletedProcess[str]:
    return sim_kubectl(sims, cluster, *args, check=False)


def secret_object(sims: SimProcess, cluster: str, namespace: str, name: str) -> dict[str, Any] | None:
    """The Secret as kubectl reads it, None when kubectl says it is not there."""
    got = kubectl(sims, cluster, "get", "secret", "-n", namespace, name, "-o", "json")
    if got.returncode != 0:
        assert "NotFound" in got.stderr or "not found" in got.stderr, got.stderr
        return None
    found: dict[str, Any] = json.loads(got.stdout)
    return found


def pod_secret_names(pod: dict[str, Any]) -> set[str]:
    """Every Secret a pod's spec names (env, envFrom, volumes), as kubectl shows the pod."""
    spec = pod["spec"]
    names = set()
    for container in spec.get("containers") or ():
        for entry in container.get("env") or ():
            ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                names.add(ref["name"])
        for entry in container.get("envFrom") or ():
            if entry.get("secretRef"):
                names.add(entry["secretRef"]["name"])
    for volume in spec.get("volumes") or ():
        if volume.get("secret"):
            names.add(volume["secret"]["secretName"])
    return names


def kubectl_pods(sims: SimProcess, cluster: str, job_id: str) -> list[dict[str, Any]]:
    got = kubectl(sims, cluster, "get", "pods", "-A", "-l", f"gpufed.io/job-id={job_id}", "-o", "json")
    assert got.returncode == 0, got.stderr
    items: list[dict[str, Any]] = json.loads(got.stdout)["items"]
    return items


def phase(fed: ServerProcess, user: str, job_id: str) -> str:
    return str(pb.JobPhase.Name(job_of(fed, user, job_id).phase)).removeprefix("JOB_PHASE_")


def leaks(text: str) -> list[str]:
    """Which forms of the values `text` holds: as written, or base64 as a Secret carries them."""
    forms = {
        "token": TOKEN,
        "password": PASSWORD,
        "token base64": base64.b64encode(TOKEN.encode()).decode(),
        "password base64": base64.b64encode(PASSWORD.encode()).decode(),
    }
    return [what for what, form in forms.items() if form in text]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def console_pages(fed: ServerProcess, user: str, paths: list[str]) -> str:
    """The console's pages as the user's browser gets them, signed in with the user's token."""
    port = fed.extra_args[fed.extra_args.index("--metrics-port") + 1]
    base = f"http://127.0.0.1:{port}"
    opener = urllib.request.build_opener(_NoRedirect, urllib.request.ProxyHandler({}))
    token = (fed.state_dir / "tokens" / f"{user}.token").read_text().strip()
    login = urllib.request.Request(
        base + "/login", data=urllib.parse.urlencode({"token": token}).encode(), headers={"Origin": base}
    )
    with pytest.raises(urllib.error.HTTPError) as answer:
        opener.open(login, timeout=10)  # a 303 to the home page, not followed
    assert answer.value.code == 303
    cookie = re.search(r"gpufed_session=([^;]+)", answer.value.headers.get("Set-Cookie", ""))
    assert cookie
    out = []
    for path in paths:
        request = urllib.request.Request(base + path, headers={"Cookie": f"gpufed_session={cookie.group(1)}"})
        with opener.open(request, timeout=10) as page:
            assert page.status == 200
            out.append(page.read().decode())
    return "\n".join(out)


def put_secrets(fed: ServerProcess, tmp_path: Path) -> None:
    """`hf` by the CLI from a file (as the docs advise for real tokens), `tracker` by the API."""
    token_file = tmp_path / "hf-token"
    token_file.write_text(TOKEN)
    token_path = fed.state_dir / "tokens" / "alice.token"
    put = run_cli(
        "--server",
        fed.target,
        "--token-file",
        str(token_path),
        "secret",
        "put",
        "hf",
        "--from-file",
        f"token={token_file}",
    )
    assert put.returncode == 0, put.stderr
    assert "secret hf (tenant vision) version 1: token" in put.stdout
    assert not leaks(put.stdout + put.stderr)
    fed.client("alice").put_secret("tracker", {"API_KEY": PASSWORD.encode(), "ENTITY": b"vision-team"})


def test_a_secret_reaches_its_jobs_pods_only_while_they_run_and_is_never_shown(
    fed: ServerProcess, sims: SimProcess, etcd: EtcdProcess, tmp_path: Path
) -> None:
    put_secrets(fed, tmp_path)
    alice = fed.client("alice")

    # A Volcano gang: its Secret is there while it runs, holding the values, and its pod reads it.
    tuned = alice.submit(TEMPLATED).job_id
    wait_for(lambda: len(gang_pods(sims, "onprem", tuned)) == 1, timeout_s=60)
    (pod,) = kubectl_pods(sims, "onprem", tuned)
    namespace = pod["metadata"]["namespace"]
    (name,) = pod_secret_names(pod)
    assert namespace == "gpufed-vision"
    held = secret_object(sims, "onprem", namespace, name)
    assert held is not None
    assert held["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpufed"
    assert held["metadata"]["labels"]["gpufed.io/job-id"] == tuned
    assert base64.b64decode(held["data"]["hf.token"]).decode() == TOKEN
    assert base64.b64decode(held["data"]["tracker.API_KEY"]).decode() == PASSWORD
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": name, "key": "hf.token"}
    assert env["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": name, "key": "tracker.API_KEY"}
    assert env["WANDB_ENTITY"]["valueFrom"]["secretKeyRef"] == {"name": name, "key": "tracker.ENTITY"}
    (creds,) = [v for v in pod["spec"]["volumes"] if v["name"] == "creds"]
    assert creds["secret"]["secretName"] == name
    assert {i["key"]: i["path"] for i in creds["secret"]["items"]} == {
        "tracker.API_KEY": "API_KEY",
        "tracker.ENTITY": "ENTITY",
    }

    # An Indexed Job on the cluster without Volcano: the short form, ending on its own. Its finished
    # pods are kept for their logs, and still name the Secret, which is gone.
    short = alice.submit(SHORT).job_id
    wait_for(lambda: phase(fed, "alice", short) == "SUCCEEDED", timeout_s=90)
    pods = kubectl_pods(sims, "plain", short)
    assert len(pods) == 2
    (short_name,) = set.union(*(pod_secret_names(p) for p in pods))
    wait_for(lambda: secret_object(sims, "plain", "gpufed-vision", short_name) is None, timeout_s=30)

    # The running job is cancelled: its Secret goes with its gang.
    alice.cancel(tuned)
    wait_for(lambda: secret_object(sims, "onprem", namespace, name) is None, timeout_s=60)

    # Nowhere else: every key and value in etcd, the server's log, the API's replies, the console.
    dump = etcdctl(etcd.endpoint, "get", "", "--prefix").stdout
    assert "/gpufed/secrets/vision/hf" in dump  # the dump does hold the sealed record
    assert not leaks(dump)
    assert not leaks(fed.log_text())
    replies = [
        alice.list_secrets(),
        alice.list_all(),
        *(alice.get(j) for j in (tuned, short)),
        *(alice.describe(j) for j in (tuned, short)),
        *(alice.explain(j) for j in (tuned, short)),
    ]
    assert not leaks("\n".join(str(r) for r in replies))
    # The audit trail says who put which secret, with its keys, and nothing of the values.
    audit = fed.client("admin").list_audit()
    assert [(e.action, e.target, e.user) for e in audit.events if e.target == "vision/hf"] == [
        ("secret_put", "vision/hf", "alice")
    ]
    assert not leaks(str(audit))
    listed = run_cli(
        "--server",
        fed.target,
        "--token-file",
        str(fed.state_dir / "tokens" / "alice.token"),
        "-o",
        "json",
        "secret",
        "list",
    )
    assert listed.returncode == 0, listed.stderr
    assert not leaks(listed.stdout)
    assert {s["name"]: s["keys"] for s in json.loads(listed.stdout)["secrets"]} == {
        "hf": ["token"],
        "tracker": ["API_KEY", "ENTITY"],
    }
    pages = console_pages(fed, "alice", ["/jobs", f"/jobs/{tuned}", f"/jobs/{short}"])
    assert tuned in pages
    assert not leaks(pages)


def test_another_tenant_can_neither_read_list_change_nor_use_the_secret(
    fed: ServerProcess, tmp_path: Path
) -> None:
    put_secrets(fed, tmp_path)
    bob = fed.client("bob")

    assert list(bob.list_secrets().secrets) == []  # his own tenant's: none
    with pytest.raises(grpc.RpcError) as listing:
        bob.list_secrets(tenant="vision")
    assert listing.value.code() == grpc.StatusCode.PERMISSION_DENIED
    writes: list[Callable[[], object]] = [
        lambda: bob.put_secret("hf", {"token": b"stolen"}, tenant="vision"),
        lambda: bob.delete_secret("hf", tenant="vision"),
    ]
    for write in writes:
        with pytest.raises(grpc.RpcError) as refused:
            write()
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # In his own tenant, alice's name is no secret of his: the same answer as a name nobody has.
    answers = {}
    for name in ("hf", "never-put"):
        with pytest.raises(grpc.RpcError) as missing:
            bob.delete_secret(name)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        answers[name] = str(missing.value.details()).replace(name, "NAME")
        with pytest.raises(grpc.RpcError) as referenced:
            bob.submit(_refers(name))
        assert referenced.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        answers[name + " ref"] = str(referenced.value.details()).replace(name, "NAME")
    assert answers["hf"] == answers["never-put"]
    assert answers["hf ref"] == answers["never-put ref"]
    assert "not found in tenant 'nlp'" in answers["hf ref"]
    assert list(bob.list_all()) == []  # nothing stored

    # His own `hf` is another secret: alice's stays as she put it.
    bob.put_secret("hf", {"token": b"bobs"})
    (mine,) = [s for s in fed.client("alice").list_secrets().secrets if s.name == "hf"]
    assert (mine.tenant, mine.version, mine.updated_by) == ("vision", 1, "alice")
    # An admin sees both, by tenant.
    shown = {(s.tenant, s.name) for s in fed.client("admin").list_secrets().secrets}
    assert {("vision", "hf"), ("vision", "tracker"), ("nlp", "hf")} <= shown


def test_a_missing_key_is_refused_at_submission_naming_the_field(fed: ServerProcess, tmp_path: Path) -> None:
    put_secrets(fed, tmp_path)
    wrong_key = SHORT.replace("key: token", "key: tokn")
    with pytest.raises(grpc.RpcError) as refused:
        fed.client("alice").submit(wrong_key)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert str(refused.value.details()) == (
        "spec.tasks[0].template.spec.containers[0].env[0].valueFrom.secretKeyRef: "
        "secret 'hf' has no key 'tokn' (its keys: token)"
    )
