"""What ListJobs and SummarizeJobs compute over the job cache, apart from the servicer's plumbing.

Both read records, never protobuf, until the answer is known: a listing converts only the page it
returns, and a summary converts nothing but its sums. Filtering by user and cluster, and the order,
happen here, on the server, so a client never pages through thousands of jobs to find a few.

Page tokens are a position in the list order (submission time, job id), which is fixed for a job's
whole life: a page never repeats or skips a job while others change phase. A newest-first token is
marked as such, so a token of one order is refused by the other rather than silently starting from
the wrong end.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass

from federation.api.v1 import gpufed_pb2 as pb
from federation.errors import InvalidArgument
from federation.store.job_cache_index import ListKey, list_key
from federation.store.job_summary import JobGroup, JobSummaryIndex
from federation.store.jobs import JobRecord
from placement.model import TenantId

# A user or cluster name is far shorter; anything longer is not one.
MAX_FILTER_LENGTH = 128
_NEWEST_FIRST_MARK = "n:"

_PB_GROUP: dict[JobGroup, pb.JobGroup.ValueType] = {
    JobGroup.QUEUED: pb.JOB_GROUP_QUEUED,
    JobGroup.ADMITTED: pb.JOB_GROUP_ADMITTED,
    JobGroup.RUNNING: pb.JOB_GROUP_RUNNING,
}


# Where a job sorts, as the cache's index sorts it: the position a page token records.
list_order = list_key


def encode_page_token(key: ListKey, *, newest_first: bool) -> str:
    mark = _NEWEST_FIRST_MARK if newest_first else ""
    return base64.urlsafe_b64encode(f"{mark}{key[0]!r}|{key[1]}".encode()).decode()


def decode_page_token(token: str, *, newest_first: bool) -> ListKey | None:
    if not token:
        return None
    try:
        text = base64.urlsafe_b64decode(token.encode()).decode()
        marked = text.startswith(_NEWEST_FIRST_MARK)
        at, _, job_id = text.removeprefix(_NEWEST_FIRST_MARK).partition("|")
        key = (float(at), job_id)
    except ValueError as error:
        raise InvalidArgument("page_token: not a token this server issued") from error
    if marked != newest_first:
        issued = "newest first" if marked else "oldest first"
        raise InvalidArgument(f"page_token: issued for a listing {issued}; ask with the same newest_first")
    return key


def _name_filter(value: str, field: str) -> str:
    if len(value) > MAX_FILTER_LENGTH:
        raise InvalidArgument(f"{field}: at most {MAX_FILTER_LENGTH} characters, got {len(value)}")
    if value != value.strip() or any(not c.isprintable() for c in value):
        raise InvalidArgument(f"{field}: a name without spaces around it or control characters")
    return value


@dataclass(frozen=True, slots=True)
class ListFilter:
    """ListJobs' narrowing beyond the tenant and phases the cache's index walks."""

    name_prefix: str = ""
    user: str = ""
    cluster: str = ""

    @classmethod
    def of(cls, req: pb.ListJobsRequest) -> ListFilter:
        return cls(
            name_prefix=req.name_prefix,
            user=_name_filter(req.user, "user"),
            cluster=_name_filter(req.cluster, "cluster"),
        )

    def wants(self, job: JobRecord) -> bool:
        if self.user and job.user != self.user:
            return False
        if self.cluster and (job.placement is None or job.placement.cluster != self.cluster):
            return False
        return job.spec.name.startswith(self.name_prefix)


def one_page(jobs: Iterable[JobRecord], wanted: ListFilter, size: int) -> tuple[list[JobRecord], bool]:
    """The first `size` wanted jobs, and whether another one follows them."""
    page: list[JobRecord] = []
    for job in jobs:
        if not wanted.wants(job):
            continue
        if len(page) == size:
            return page, True
        page.append(job)
    return page, False


def summary_reply(index: JobSummaryIndex, tenant: TenantId | None) -> pb.JobSummary:
    """SummarizeJobs' answer from the job cache's kept sums, rows ordered by tenant, GPU type and
    group, counts by tenant and group (the order the walk over every live job gave)."""
    rows, counts = index.sums(tenant)
    return pb.JobSummary(
        rows=[
            pb.JobSummaryRow(tenant=t, gpu_type=g, group=_PB_GROUP[grp], gpus=gpus, jobs=jobs)
            for t, g, grp, gpus, jobs in sorted(rows, key=lambda r: (r[0], r[1], _PB_GROUP[r[2]]))
        ],
        tenants=[
            pb.TenantJobCount(tenant=t, group=_PB_GROUP[grp], jobs=n)
            for t, grp, n in sorted(counts, key=lambda c: (c[0], _PB_GROUP[c[1]]))
        ],
    )


def summarize(jobs: Iterable[JobRecord], tenant: TenantId | None) -> pb.JobSummary:
    """The same answer over any jobs, summed afresh (the console's tests build their queues so)."""
    index = JobSummaryIndex()
    index.build(jobs)
    return summary_reply(index, tenant)
