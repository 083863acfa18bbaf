"""Jobs and secrets: the check at submission, and the copy of the values at dispatch.

At submission every secret a task names must exist in the job's own tenant, with each key it names
(unless the reference is `optional`); a name of another tenant's secret is refused in the same words
as a name nobody has, so a job cannot probe for other tenants' secrets. At dispatch the values are
opened (only then, and only in memory) and handed to the member cluster's backend with the gang; a
secret deleted since the submission fails the job, saying which secret and how to go on.
"""

from __future__ import annotations

import json
from dataclasses import replace

from clusters.api import GangSecret, GangWorkload
from federation.errors import InvalidSpec, NotFound
from federation.secrets.crypto import SecretUnreadable
from federation.secrets.masking import SecretMask
from federation.secrets.store import SecretInfo, SecretStore
from federation.spec.jobspec import TrainingJobSpec
from federation.spec.secret_refs import template_refs


class SecretCheck:
    """The submission check (`JobService.checked`)."""

    def __init__(self, secrets: SecretStore) -> None:
        self._secrets = secrets

    async def check(self, tenant: str, spec: TrainingJobSpec) -> None:
        known: dict[str, SecretInfo | None] = {}
        for i, task in enumerate(spec.tasks):
            if not task.template:
                continue
            for ref in template_refs(json.loads(task.template), f"spec.tasks[{i}].template"):
                if not ref.secret:
                    raise InvalidSpec(ref.field, "names no secret")
                if ref.secret not in known:
                    known[ref.secret] = await self._secrets.info(tenant, ref.secret)
                info = known[ref.secret]
                if info is None:
                    raise InvalidSpec(
                        ref.field,
                        f"secret {ref.secret!r} not found in tenant {tenant!r} (`gpufed secret list` shows "
                        "the tenant's secrets; a Secret on a member cluster is not one)",
                    )
                if ref.key and not ref.optional and ref.key not in info.keys:
                    raise InvalidSpec(
                        ref.field,
                        f"secret {ref.secret!r} has no key {ref.key!r} (its keys: {', '.join(info.keys)})",
                    )


def uses_secrets(spec: TrainingJobSpec) -> bool:
    """Whether any task's template names a secret (the reconciler releases such attempts' copies)."""
    return bool(spec_secrets(spec))


def spec_secrets(spec: TrainingJobSpec) -> list[str]:
    """The secrets a job's task templates name (what its pods were given)."""
    names: set[str] = set()
    for task in spec.tasks:
        if task.template:
            names.update(r.secret for r in template_refs(json.loads(task.template)) if r.secret)
    return sorted(names)


class JobSecretMasks:
    """The mask of a job's secret values, for its logs and describe view (`federation.secrets.masking`).

    Read from the store when asked: the values the job's pods hold now (a secret put again since
    the job ran is masked with its new values; lines printed with the old ones, and kept before
    the put, were masked when kept)."""

    def __init__(self, secrets: SecretStore) -> None:
        self._secrets = secrets

    async def for_job(self, tenant: str, spec: TrainingJobSpec) -> SecretMask:
        names = spec_secrets(spec)
        if not names:
            return SecretMask(())
        values: list[bytes] = []
        missing: list[str] = []
        for name in names:
            try:
                values.extend((await self._secrets.open(tenant, name)).values())
            except (NotFound, SecretUnreadable):
                missing.append(name)
        return SecretMask(values, missing=tuple(missing))


def referenced_secrets(gang: GangWorkload) -> list[str]:
    names: set[str] = set()
    for replica in gang.replicas:
        if replica.pod_template:
            names.update(r.secret for r in template_refs(json.loads(replica.pod_template)))
    return sorted(names)


class SecretMissing(NotFound):
    """A secret a job references was deleted between its submission and its dispatch."""


class GangSecrets:
    """The dispatcher's side: the gang with the values of the secrets its pods reference."""

    def __init__(self, secrets: SecretStore) -> None:
        self._secrets = secrets

    async def attach(self, gang: GangWorkload) -> GangWorkload:
        names = referenced_secrets(gang)
        if not names:
            return gang
        attached = []
        for name in names:
            try:
                values = await self._secrets.open(gang.tenant, name)
            except NotFound:
                raise SecretMissing(
                    f"secret {name!r} of tenant {gang.tenant!r} was deleted after the job was submitted: "
                    "put it again and submit the job again"
                ) from None
            attached.append(GangSecret(name, tuple(sorted(values.items()))))
        return replace(gang, secrets=tuple(attached))
