"""Schema versions of stored documents (issue 31, "Upgrades"): every write carries this build's
version, a document without one reads as the previous build's, and one newer than this build is
refused with an error naming its key and saying to upgrade, and is never rewritten."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from federation.api.status import status_code_for
from federation.security.tokens import SecurityStore, TokenRecord
from federation.store.job_store import KvStore, job_key
from federation.store.jobs import JobRecord, job_to_dict
from federation.store.kv_memory import MemoryKv
from federation.store.records import TenantRecord
from federation.store.schema_version import (
    SCHEMA_FIELD,
    SCHEMA_VERSION,
    SchemaTooNew,
    check,
    check_json,
    stamp_json,
)
from placement.model import JobId, TenantId

MakeJob = Callable[..., JobRecord]


@pytest.mark.parametrize(
    ("doc", "version"),
    [
        pytest.param({"a": 1}, 0, id="no-field-is-the-previous-build"),
        pytest.param({"schema": 0, "a": 1}, 0, id="zero"),
        pytest.param({"schema": SCHEMA_VERSION}, SCHEMA_VERSION, id="this-build"),
    ],
)
def test_versions_this_build_reads(doc: dict[str, object], version: int) -> None:
    assert check(doc, b"/gpufed/x") == version
    assert check_json(json.dumps(doc).encode(), b"/gpufed/x") == version


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(SCHEMA_VERSION + 1, id="newer"),
        pytest.param("2", id="a-string"),
        pytest.param(True, id="a-bool"),
        pytest.param(-1, id="negative"),
    ],
)
def test_a_version_this_build_does_not_know_is_refused_naming_key_and_version(value: object) -> None:
    raw = json.dumps({"job_id": "j1", SCHEMA_FIELD: value}).encode()
    calls: list[Callable[[], int]] = [
        lambda: check(json.loads(raw), b"/gpufed/jobs/j1"),
        lambda: check_json(raw, b"/gpufed/jobs/j1"),
    ]
    for call in calls:
        with pytest.raises(SchemaTooNew) as e:
            call()
        assert "/gpufed/jobs/j1" in str(e.value)
        assert str(json.loads(raw)[SCHEMA_FIELD]) in str(e.value)
        assert "upgrade gpufed" in str(e.value)


@pytest.mark.parametrize(
    ("raw", "version"),
    [
        pytest.param(b'{"schema":1,"a":1}', 1, id="written-by-dumps"),
        pytest.param(b'{"schema":1}', 1, id="alone"),
        pytest.param(b'{"a":{"schema":7},"b":"schema"}', 0, id="only-nested-or-a-value"),
        pytest.param(b'{"a":1,"schema":1}', 1, id="not-first"),
        pytest.param(b"[1,2]", 0, id="a-list-carries-none"),
    ],
)
def test_the_quick_read_of_the_version_agrees_with_the_decoded_one(raw: bytes, version: int) -> None:
    assert check_json(raw, b"k") == version
    assert check_json(raw.decode(), b"k") == version


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b'{"schema":2,"a":1}', id="first"),
        pytest.param(b'{"schema":10,"a":1}', id="starts-as-this-builds"),
        pytest.param(b'{"schema":1e1,"a":1}', id="an-exponent"),
        pytest.param(b'{"a":1,"schema":2}', id="last"),
        pytest.param(b'{"schema":99999999999999,"a":1}', id="huge"),
        pytest.param(b'{"schema":1.5}', id="a-float"),
    ],
)
def test_the_quick_read_refuses_what_the_decoded_one_refuses(raw: bytes) -> None:
    with pytest.raises(SchemaTooNew, match="upgrade gpufed"):
        check_json(raw, b"/gpufed/x")


def test_too_new_maps_to_failed_precondition_not_internal() -> None:
    assert status_code_for(SchemaTooNew("/gpufed/jobs/j1", 9)).name == "FAILED_PRECONDITION"


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        pytest.param(b'{"format":"x","a":1}', {"schema": SCHEMA_VERSION, "format": "x", "a": 1}, id="object"),
        pytest.param(b"{}", {"schema": SCHEMA_VERSION}, id="empty"),
        pytest.param(b' { "a" : 1 }', {"schema": SCHEMA_VERSION, "a": 1}, id="spaces"),
    ],
)
def test_stamp_json_puts_the_version_first_without_changing_the_rest(
    raw: bytes, want: dict[str, object]
) -> None:
    out = stamp_json(raw)
    assert json.loads(out) == want
    assert out.startswith(b'{"schema":')


async def test_every_write_of_the_job_store_carries_the_version(make_job: MakeJob) -> None:
    kv = MemoryKv()
    store = KvStore(kv)
    await store.create_job(make_job("j1"), idempotency_key="k1", manifest_digest="d")
    await store.put_tenant(TenantRecord(name=TenantId("t1")))
    await store.put_token("secret", "alice")
    await SecurityStore(kv).put_token(
        "other",
        TokenRecord(token_id="abc", user="bob", issued_by="admin", issued_at_s=1.0, expires_at_s=None),
    )
    page = await kv.range_prefix(b"/gpufed/")
    assert len(page.kvs) == 5  # the job, its idempotency key, the tenant and two tokens
    for item in page.kvs:
        assert json.loads(item.value)[SCHEMA_FIELD] == SCHEMA_VERSION, item.key


async def test_the_previous_builds_documents_read_as_before(make_job: MakeJob) -> None:
    kv = MemoryKv()
    store = KvStore(kv)
    job = make_job("j1")
    # As the build before versions wrote them: the same JSON without the field.
    await kv.put(job_key(JobId("j1")), json.dumps(job_to_dict(job)).encode())
    await kv.put(b"/gpufed/tenants/t1", json.dumps({"name": "t1"}).encode())
    got = await store.get_job(JobId("j1"))
    assert got is not None
    assert got.value == job
    tenant = await store.get_tenant("t1")
    assert tenant is not None
    assert tenant.name == TenantId("t1")


async def test_a_newer_job_is_refused_on_every_read_and_left_as_it_is(make_job: MakeJob) -> None:
    kv = MemoryKv()
    store = KvStore(kv)
    newer = {**job_to_dict(make_job("j2")), SCHEMA_FIELD: SCHEMA_VERSION + 1, "added_later": [1]}
    raw = json.dumps(newer).encode()
    await kv.put(job_key(JobId("j2")), raw)
    for read in (store.get_job(JobId("j2")), store.list_jobs()):
        with pytest.raises(SchemaTooNew, match=r"/gpufed/jobs/j2 has schema version 2.*upgrade gpufed"):
            await read
    held = await kv.get(job_key(JobId("j2")))
    assert held is not None
    assert held.value == raw
    # The job cache's list leaves it out, so that nothing acts on a record it cannot read.
    entries, _ = await store.list_job_entries()
    assert [head.job_id for head, _ in entries] == []
