"""What `gpufed up` suggests trying first, from the users of the config it started with.

The bundled default has alice (tenant vision) and an example job for vision, but `gpufed up --config X`
may name other users, or none at all: a suggestion must name a user whose token `up` just wrote, or say
how to get one.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

from federation.store.records import Role, UserRecord

# The example the README starts with, and the tenant its `spec.tenant` names.
EXAMPLE_JOB = Path("examples/resnet-vision.yaml")
EXAMPLE_TENANT = "vision"


def _pick(users: Sequence[UserRecord], with_token: Collection[str]) -> UserRecord | None:
    """A member (who submits jobs) before an operator; alice first, as in the README; else by name."""
    usable = [u for u in users if u.name in with_token]
    ranked = sorted(usable, key=lambda u: (u.role is not Role.MEMBER, u.name != "alice", u.name))
    return ranked[0] if ranked else None


def first_steps(
    users: Sequence[UserRecord], with_token: Collection[str], *, config: str, example_here: bool
) -> list[str]:
    """Lines for `gpufed up` to print once ready. `with_token`: the users whose token file it wrote;
    `example_here`: whether `examples/resnet-vision.yaml` exists where the user runs gpufed."""
    user = _pick(users, with_token)
    if user is None:
        return [
            f"no user in {config} has a token: add one under `users:`, e.g. "
            "`- {name: me, tenant: TENANT, role: admin}`, and start gpufed up again; its token is "
            "written to STATE/tokens/me.token, used by `gpufed --user me ...`; an admin then issues "
            "others with `gpufed --user me token issue NAME`"
        ]
    if user.role is Role.MEMBER and user.tenant == EXAMPLE_TENANT and example_here:
        return [f"try: gpufed --user {user.name} submit -f {EXAMPLE_JOB}"]
    lines = [f"try: gpufed --user {user.name} whoami"]
    if user.role is Role.MEMBER:
        lines.append(
            f"then: gpufed --user {user.name} submit -f JOB.yaml "
            f"(a TrainingJob with spec.tenant: {user.tenant})"
        )
    return lines
