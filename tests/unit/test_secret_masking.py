"""Secret values masked out of what a job's programs print (federation.secrets.masking), and out of
the copy of an ended attempt's logs that is kept in etcd (federation.joblogs.archive)."""

from __future__ import annotations

import base64

from clusters.api import ReplicaState
from federation.api.v1 import gpufed_pb2 as pb
from federation.joblogs.archive import KeptAttempt, KeptReplica, LogArchive, LogsSettings, replica_key
from federation.secrets.masking import MASK, MIN_MASKED_CHARS, SecretMask
from federation.store.kv_memory import MemoryKv

TOKEN = b"hf_0123456789abcdef"


def test_a_value_its_base64_and_each_of_its_lines_are_masked() -> None:
    pem = b"-----BEGIN-----\nMIIBOgIBAAJBAK\nAoGBAMx\n-----END-----\n"
    mask = SecretMask([TOKEN, pem])
    b64 = base64.b64encode(TOKEN).decode()
    assert mask.text(f"token={TOKEN.decode()} and {b64}.") == f"token={MASK} and {MASK}."
    assert mask.text("line MIIBOgIBAAJBAK here, AoGBAMx there") == f"line {MASK} here, {MASK} there"
    assert mask.data(b"x" + TOKEN + b"y") == b"x" + MASK.encode() + b"y"


def test_the_longest_form_is_masked_whole() -> None:
    mask = SecretMask([b"abcd", b"abcdefgh"])
    assert mask.text("abcdefgh") == MASK


def test_values_too_short_to_mask_are_left_and_an_empty_mask_changes_nothing() -> None:
    short = b"x" * (MIN_MASKED_CHARS - 1)
    mask = SecretMask([short])
    assert not mask
    assert mask.text("xxx yyy") == "xxx yyy"
    assert mask.data(b"xxx") == b"xxx"


def test_a_value_that_is_not_text_is_masked_in_bytes() -> None:
    raw = bytes(range(250, 256)) + b"\x00\x01"
    mask = SecretMask([raw])
    assert mask.data(b"a" + raw + b"b") == b"a" + MASK.encode() + b"b"
    # Its base64 is text, and masked in text.
    assert mask.text(base64.b64encode(raw).decode()) == MASK


def test_every_string_in_a_describe_reply_is_masked_nested_and_repeated() -> None:
    text = f"token {TOKEN.decode()}"
    reply = pb.JobDescription(
        job=pb.Job(job_id="j", message=text),
        spec_summary=[text],
        wait_reasons=[text, "fine"],
        attempts=[
            pb.AttemptDescription(
                attempt=1,
                replicas=[pb.ReplicaDescription(pod="p", message=text)],
                events=[pb.KubeEvent(reason="Started", message=text)],
            )
        ],
    )
    SecretMask([TOKEN]).message(reply)
    assert TOKEN.decode() not in str(reply)
    assert reply.wait_reasons == [f"token {MASK}", "fine"]
    assert reply.attempts[0].replicas[0].message == f"token {MASK}"
    assert reply.attempts[0].events[0].message == f"token {MASK}"
    assert reply.job.message == f"token {MASK}"


async def test_the_kept_copy_is_masked_before_it_is_written_to_etcd() -> None:
    kv = MemoryKv()
    asked: list[str] = []

    async def mask_for(job_id: str) -> SecretMask:
        asked.append(job_id)
        return SecretMask([TOKEN])

    archive = LogArchive(kv, LogsSettings(), mask_for)
    state = ReplicaState(
        pod="p-0", task="main", index=0, by_rank=False, node="n", phase="Failed", restarts=0,
        exit_code=1, reason="Error", message=f"died holding {TOKEN.decode()}",
    )  # fmt: skip
    kept = KeptAttempt(
        attempt=1, cluster="c", gpu_type="A100", capacity_kind="private", usd_per_gpu_hour=1.0,
        started_at_s=1.0, finished_at_s=2.0, outcome="FAILED", reason="Error", kept_at_s=2.0,
        note="", replicas=(KeptReplica("main", 0, state, 40),),
    )  # fmt: skip
    await archive.keep("job-1", kept, {("main", 0): b"printed " + TOKEN + b"\n"})
    assert asked == ["job-1"]
    stored = await kv.get(replica_key("job-1", 1, "main", 0))
    assert stored is not None
    assert stored.value == b"printed ***\n"
    summary = await archive.summary("job-1", 1, now_s=3.0)
    assert summary is not None
    assert summary.replicas[0].state.message == f"died holding {MASK}"
    everything = await kv.range_prefix(b"")
    assert not any(TOKEN in item.value for item in everything.kvs)
