"""Kubernetes names and label values for gpufed's objects, valid and stable across restarts.

gpufed's job ids and tenants are already DNS-like, but the cluster checks rules the federation does
not know about: a pod's hostname is at most 63 characters, a Service name must start with a letter,
a label value has its own alphabet. Every name here is a pure function of its input, so a second
dispatch of the same attempt (after a crash, or a retry) computes the same name and finds the object
it created the first time; where a name must be cut short, a hash of the full text keeps it unique.
"""

from __future__ import annotations

import functools
import hashlib
import re

from clusters.api import gang_name
from placement.model import JobId, TenantId

# Room for "-<task>-<index>" after the gang name inside a 63-character pod hostname.
MAX_GANG_NAME = 48
MAX_LABEL = 63

_NOT_DNS = re.compile(r"[^a-z0-9-]+")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_NOT_LABEL = re.compile(r"[^-A-Za-z0-9_.]+")


def digest(text: str, length: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def shorten(text: str, max_len: int) -> str:
    """`text` if it fits, else a prefix and a hash of the whole, so that two long names stay apart."""
    if len(text) <= max_len:
        return text
    if max_len < 10:
        return digest(text, max_len)
    return f"{text[: max_len - 9].rstrip('-.')}-{digest(text)}"


@functools.lru_cache(maxsize=16384)
def dns_label(text: str, max_len: int = MAX_LABEL) -> str:
    """A DNS-1035 label (lowercase, starts with a letter): valid for every kind of object we make.

    Text that had to change gets a hash of the original, so `Job_A` and `job-a` stay two objects.
    Remembered (a pure function of its arguments): a job's gang, namespace, queue and task names
    are asked for about 16 times in its life (dispatch, status, keep, collect), 1 % of the server's
    event loop in bench/scale.py.
    """
    if max_len < 10:
        return f"h{digest(text, max_len - 1)}"
    clean = _NOT_DNS.sub("-", text.lower()).strip("-")
    if not clean or not clean[0].isalpha():
        clean = f"g-{clean}".rstrip("-")
    if clean != text:
        return f"{clean[: max_len - 9].rstrip('-')}-{digest(text)}"
    return shorten(clean, max_len)


def label_value(text: str) -> str:
    """A valid label value for `text`; the exact text goes into an annotation beside it."""
    if len(text) <= MAX_LABEL and _LABEL_VALUE.fullmatch(text):
        return text
    clean = _NOT_LABEL.sub("-", text).strip("-_.")
    return shorten(f"{clean[:50].rstrip('-_.')}-{digest(text)}".lstrip("-"), MAX_LABEL)


def object_name(job_id: JobId, attempt: int) -> str:
    """The name of the gang object, its Service and its PodGroup for this attempt."""
    return dns_label(gang_name(job_id, attempt), MAX_GANG_NAME)


def task_name(gang: str, task: str, replicas: int) -> str:
    """A task name short enough that Volcano's pod `<gang>-<task>-<index>` is a valid hostname."""
    budget = MAX_LABEL - len(gang) - 2 - len(str(max(replicas - 1, 0)))
    return dns_label(task, max(budget, 1))


def namespace_for(prefix: str, tenant: TenantId) -> str:
    return dns_label(f"{prefix}{tenant}")


def queue_for(tenant: TenantId) -> str:
    return dns_label(tenant)
