"""Where the wait's controls are written (issue 35): a tenant's `costPolicy`, a job's `spec.maxWait`,
and the shipped config's wait; each bad value named by its field, and each stored and read back."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from federation.errors import InvalidSpec
from federation.runtime.config import parse_config
from federation.runtime.embedded import default_config_path
from federation.spec.training_job import parse_manifest
from federation.store.config_policy import parse_tenant, tenant_document
from federation.store.jobs import spec_from_dict, spec_to_dict
from federation.store.records import TenantRecord, tenant_from_dict, tenant_to_dict
from placement.model import TenantId
from placement.model_policy import CostPolicy

ROOT = Path(__file__).resolve().parents[2]

MANIFEST = """\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {{name: waits}}
spec:
  gpuTypes: [A100]
  {extra}
  tasks:
    - {{name: worker, replicas: 1, image: "pytorch/pytorch:2.3", gpus: 8}}
"""


@pytest.mark.parametrize("policy", list(CostPolicy))
def test_a_tenant_s_cost_policy_round_trips_through_its_document_and_the_store(policy: CostPolicy) -> None:
    record = parse_tenant({"name": "vision", "costPolicy": policy.value}, "tenant", priority_classes=())
    assert record.cost_policy is policy
    assert tenant_document(record)["costPolicy"] == policy.value
    assert parse_tenant(tenant_document(record), "tenant", priority_classes=()) == record
    assert tenant_from_dict(tenant_to_dict(record)) == record
    assert record.quota().cost_policy is policy


def test_a_tenant_without_one_is_balanced_and_older_records_read_back_unchanged() -> None:
    record = parse_tenant({"name": "vision"}, "tenant", priority_classes=())
    assert record.cost_policy is CostPolicy.BALANCED
    stored = tenant_to_dict(TenantRecord(name=TenantId("vision")))
    assert "cost_policy" not in stored, "a balanced tenant's record is written as before"
    assert tenant_from_dict(stored).cost_policy is CostPolicy.BALANCED


def test_a_bad_cost_policy_is_named() -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_tenant({"name": "vision", "costPolicy": "cheap"}, "tenants[2]", priority_classes=())
    assert caught.value.field == "tenants[2].costPolicy"
    assert "saver, balanced, fast" in str(caught.value)


MAX_WAIT_CASES = [
    pytest.param("", None, id="absent"),
    pytest.param("maxWait: 2h", 7200, id="duration"),
    pytest.param("maxWait: 1d12h", 129600, id="days"),
    pytest.param("maxWait: 0s", 0, id="never-waits"),
    pytest.param("maxWait: 0", 0, id="zero"),
]


@pytest.mark.parametrize(("extra", "seconds"), MAX_WAIT_CASES)
def test_max_wait_is_read_stored_and_written_back(extra: str, seconds: int | None) -> None:
    spec = parse_manifest(MANIFEST.format(extra=extra), priority_classes=("normal",))
    assert spec.max_wait_s == seconds
    assert spec_from_dict(spec_to_dict(spec)) == spec
    if seconds is None:
        assert "max_wait_s" not in spec_to_dict(spec), "older records keep their form"


@pytest.mark.parametrize("bad", ["maxWait: soon", "maxWait: -5", "maxWait: 31d", "maxWait: true"])
def test_a_bad_max_wait_is_named(bad: str) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_manifest(MANIFEST.format(extra=bad), priority_classes=("normal",))
    assert caught.value.field == "spec.maxWait"


def test_the_shipped_config_turns_on_the_replay_s_wait() -> None:
    """The shipped config's wait (and its moves back to private GPUs) is the setting the Philly replay
    measured as `gpufed`: read from the replay's own config, so that a retune of one without the other
    fails here."""
    policy = parse_config(default_config_path().read_text()).settings.policy
    replayed = yaml.safe_load((ROOT / "bench" / "replay.yaml").read_text())["policies"]["gpufed"]
    knobs = (
        "private_wait_s_per_gpu_hour",
        "private_wait_max_s",
        "private_wait_needs_start",
        "private_wait_needs_start_after_s",
        "private_wait_reserve",
        "spot_max_restart_slowdown",
        "prefer_private",
        "private_rate_sunk",
        "repatriate",
        "repatriate_min_saving_usd",
        "move_overhead_s",
    )
    assert {k: getattr(policy, k) for k in knobs} == {k: replayed[k] for k in knobs}
    assert (policy.private_wait_s_per_gpu_hour, policy.private_rate_sunk) == (350.0, True)
    # The replay's placer is told its world's cycle and cloud start (30 s + 300 s); the shipped margin
    # allows a real cloud's node start more.
    assert policy.private_wait_deadline_margin_s == 600.0
