"""Tenants' secrets in the store, and jobs' references to them: what is kept in clear (never a
value), versions, the submission check, and the dispatcher's copy bound into the pods' templates."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from clusters.api import GangSecret, GangWorkload, ReplicaSpec
from clusters.kubernetes.secret_objects import bind_template, bound_gang, secret_manifest
from federation.errors import InvalidSpec, NotFound
from federation.secrets.crypto import Keyring
from federation.secrets.jobs import GangSecrets, SecretCheck, SecretMissing, referenced_secrets
from federation.secrets.store import SecretsDisabled, SecretStore
from federation.spec.secret_refs import template_refs
from federation.spec.training_job import parse_manifest
from federation.store.kv_memory import MemoryKv
from placement.model import CapacityKind, GpuType, JobId, TenantId

VALUE = b"tok-7d1e0c-never-in-clear"


def a_store() -> tuple[MemoryKv, SecretStore]:
    kv = MemoryKv()
    return kv, SecretStore(kv, Keyring([os.urandom(32)]))


def a_job(task: str) -> str:
    return f"""\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {{name: j}}
spec:
  gpuTypes: [A100]
  tasks:
{task}"""


async def test_put_keeps_names_and_versions_in_clear_and_values_sealed() -> None:
    kv, store = a_store()
    first = await store.put("vision", "hf", {"token": VALUE}, by="alice", at_s=10.0)
    again = await store.put("vision", "hf", {"token": VALUE, "user": b"me"}, by="alice", at_s=20.0)
    assert (first.version, again.version) == (1, 2)
    assert (again.created_at_s, again.updated_at_s, again.keys) == (10.0, 20.0, ("token", "user"))
    raw = b"".join(k.key + k.value for k in (await kv.range_prefix(b"/")).kvs)
    assert b"/gpufed/secrets/vision/hf" in raw
    assert VALUE not in raw
    assert await store.open("vision", "hf") == {"token": VALUE, "user": b"me"}
    assert [i.name for i in await store.list("vision")] == ["hf"]
    assert await store.list("nlp") == []
    # Another tenant's name is another secret.
    with pytest.raises(NotFound, match="secret 'hf' not found in tenant 'nlp'"):
        await store.open("nlp", "hf")
    deleted = await store.delete("vision", "hf")
    assert deleted.version == 2
    assert await store.list(None) == []


@pytest.mark.parametrize(
    ("data", "words"),
    [
        pytest.param({}, "at least one key", id="no-keys"),
        pytest.param({"a/b": b"x"}, "letters, digits", id="slash-in-key"),
        pytest.param({"..": b"x"}, "letters, digits", id="dot-dot"),
        pytest.param({"k": b"x" * (256 * 1024 + 1)}, "at most 262144 bytes", id="too-big"),
    ],
)
async def test_a_bad_put_is_refused_naming_the_field_and_never_the_value(
    data: dict[str, bytes], words: str
) -> None:
    _, store = a_store()
    with pytest.raises(InvalidSpec) as refused:
        await store.put("vision", "hf", data, by="alice", at_s=1.0)
    assert words in str(refused.value)
    assert "xxxx" not in str(refused.value)


async def test_without_a_key_file_secrets_are_off_and_say_how_to_turn_them_on() -> None:
    store = SecretStore(MemoryKv(), None)
    with pytest.raises(SecretsDisabled, match="GPUFED_SECRETS_KEY_FILE=PATH"):
        await store.put("vision", "hf", {"token": VALUE}, by="alice", at_s=1.0)


SHORT = a_job("""\
    - name: main
      replicas: 1
      gpus: 1
      image: busybox
      env: {PLAIN: x}
      secretEnv: [{name: HF_TOKEN, secret: hf, key: token}]
""")
TEMPLATED = a_job("""\
    - name: main
      replicas: 1
      gpus: 1
      template:
        spec:
          initContainers:
            - {name: fetch, image: busybox, envFrom: [{secretRef: {name: tracker}}]}
          containers:
            - name: main
              image: busybox
              env: [{name: OWN, value: "1"}, {name: T, valueFrom: {secretKeyRef: {name: hf, key: token}}}]
              envFrom: [{configMapRef: {name: cm}}, {secretRef: {name: tracker}, prefix: W_}]
              volumeMounts: [{name: creds, mountPath: /c}, {name: mixed, mountPath: /m}]
          volumes:
            - {name: creds, secret: {secretName: tracker, items: [{key: API_KEY, path: key.txt}]}}
            - name: mixed
              projected: {sources: [{secret: {name: hf}}, {configMap: {name: cm}}]}
""")


def spec_of(text: str) -> Any:
    return parse_manifest(text, priority_classes=["normal"])


def test_secret_env_becomes_the_main_containers_secret_key_refs() -> None:
    (task,) = spec_of(SHORT).tasks
    template = json.loads(task.template)
    assert template["spec"]["containers"] == [
        {
            "name": "main",
            "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"key": "token", "name": "hf"}}}],
        }
    ]
    assert task.env == (("PLAIN", "x"),)


@pytest.mark.parametrize(
    ("entry", "field", "words"),
    [
        pytest.param(
            "{name: PLAIN, secret: hf, key: token}", "secretEnv[0].name", "duplicate variable", id="dup"
        ),
        pytest.param(
            "{name: RANK, secret: hf, key: token}", "secretEnv[0].name", "set by gpufed", id="owned"
        ),
        pytest.param("{name: T, secret: Hf, key: token}", "secretEnv[0].secret", "DNS label", id="bad-name"),
        pytest.param("{name: T, secret: hf, key: a/b}", "secretEnv[0].key", "secret's key", id="bad-key"),
        pytest.param("{name: T, secret: hf}", "secretEnv[0].key", "is required", id="no-key"),
        pytest.param(
            "{name: T, secret: hf, key: k, value: v}", "secretEnv[0].value", "unknown field", id="extra"
        ),
    ],
)
def test_bad_secret_env_is_refused_naming_the_field(entry: str, field: str, words: str) -> None:
    text = SHORT.replace("[{name: HF_TOKEN, secret: hf, key: token}]", f"[{entry}]")
    with pytest.raises(InvalidSpec) as refused:
        spec_of(text)
    assert refused.value.field == f"spec.tasks[0].{field}"
    assert words in refused.value.rule


def test_every_place_a_template_names_a_secret_is_found() -> None:
    (task,) = spec_of(TEMPLATED).tasks
    found = [(r.secret, r.key, r.field) for r in template_refs(json.loads(task.template), "t")]
    assert found == [
        ("tracker", "", "t.spec.initContainers[0].envFrom[0].secretRef"),
        ("hf", "token", "t.spec.containers[0].env[1].valueFrom.secretKeyRef"),
        ("tracker", "", "t.spec.containers[0].envFrom[1].secretRef"),
        ("tracker", "API_KEY", "t.spec.volumes[0].secret.items[0]"),
        ("hf", "", "t.spec.volumes[1].projected.sources[0].secret"),
    ]


async def test_submission_needs_each_secret_and_key_in_the_jobs_own_tenant() -> None:
    _, store = a_store()
    check = SecretCheck(store)
    spec = spec_of(TEMPLATED)
    await store.put("nlp", "hf", {"token": VALUE}, by="bob", at_s=1.0)
    await store.put("nlp", "tracker", {"API_KEY": VALUE}, by="bob", at_s=1.0)
    # Another tenant's secrets of the same names do not count.
    with pytest.raises(InvalidSpec, match="secret 'tracker' not found in tenant 'vision'"):
        await check.check("vision", spec)
    await store.put("vision", "tracker", {"API_KEY": VALUE}, by="alice", at_s=1.0)
    await store.put("vision", "hf", {"tok": VALUE}, by="alice", at_s=1.0)
    with pytest.raises(InvalidSpec) as refused:
        await check.check("vision", spec)
    assert str(refused.value) == (
        "spec.tasks[0].template.spec.containers[0].env[1].valueFrom.secretKeyRef: "
        "secret 'hf' has no key 'token' (its keys: tok)"
    )
    await store.put("vision", "hf", {"token": VALUE}, by="alice", at_s=2.0)
    await check.check("vision", spec)


def a_gang(template: str, tenant: str = "vision") -> GangWorkload:
    return GangWorkload(
        job_id=JobId("j-1"),
        attempt=1,
        tenant=TenantId(tenant),
        gpu_type=GpuType("A100"),
        kind=CapacityKind.PRIVATE,
        priority_class="normal",
        replicas=(ReplicaSpec("main", 0, 1, "busybox", (), (), pod_template=template),),
        min_available=1,
        max_runtime_s=60,
    )


async def test_dispatch_attaches_the_values_and_fails_clearly_when_one_was_deleted() -> None:
    _, store = a_store()
    (task,) = spec_of(TEMPLATED).tasks
    gang = a_gang(task.template)
    assert referenced_secrets(gang) == ["hf", "tracker"]
    await store.put("vision", "hf", {"token": VALUE}, by="alice", at_s=1.0)
    with pytest.raises(SecretMissing, match="secret 'tracker' of tenant 'vision' was deleted"):
        await GangSecrets(store).attach(gang)
    await store.put("vision", "tracker", {"API_KEY": b"k", "ENTITY": b"e"}, by="alice", at_s=1.0)
    attached = await GangSecrets(store).attach(gang)
    assert [s.name for s in attached.secrets] == ["hf", "tracker"]
    assert VALUE.decode() not in repr(attached)  # a log line of the workload shows no value


def test_the_bound_template_reads_only_the_gangs_secret() -> None:
    (task,) = spec_of(TEMPLATED).tasks
    secrets = (
        GangSecret("hf", (("token", VALUE),)),
        GangSecret("tracker", (("API_KEY", b"k"), ("ENTITY", b"e"), ("bad key", b"x"))),
    )
    gang = bound_gang(GangWorkload(**{**_fields(a_gang(task.template)), "secrets": secrets}), "g-secrets")
    template = json.loads(gang.replicas[0].pod_template)
    assert {r.secret for r in template_refs(template)} == {"g-secrets"}
    main = template["spec"]["containers"][0]
    # envFrom's keys come first, so the container's own env still wins, as it does over envFrom.
    assert [e["name"] for e in main["env"]] == ["W_API_KEY", "W_ENTITY", "OWN", "T"]
    assert main["env"][3]["valueFrom"]["secretKeyRef"] == {"name": "g-secrets", "key": "hf.token"}
    assert main["envFrom"] == [{"configMapRef": {"name": "cm"}}]
    assert "envFrom" not in template["spec"]["initContainers"][0]
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert volumes["creds"]["secret"] == {
        "secretName": "g-secrets",
        "items": [{"key": "tracker.API_KEY", "path": "key.txt"}],
    }
    assert volumes["mixed"]["projected"]["sources"][0]["secret"] == {
        "name": "g-secrets",
        "items": [{"key": "hf.token", "path": "token"}],
    }
    manifest = secret_manifest(gang, {"name": "g-secrets", "namespace": "gpufed-vision"})
    assert set(manifest["data"]) == {"hf.token", "tracker.API_KEY", "tracker.ENTITY", "tracker.bad key"}
    assert bind_template({"spec": {}}, "x", {}) == {"spec": {}}


def _fields(gang: GangWorkload) -> dict[str, Any]:
    return {name: getattr(gang, name) for name in GangWorkload.__dataclass_fields__}
