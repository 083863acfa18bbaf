"""Where store credentials come from, and the `Secret` wrapper that keeps them out of reprs and logs.

S3 credentials are looked up the way the AWS tools do, first hit wins:
1. environment variables the store's config names (`access_key_id_env`, `secret_access_key_env`,
   `session_token_env`): how two stores in one process get different keys;
2. the standard `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` / `AWS_SESSION_TOKEN`, unless the config
   names a profile;
3. the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`, else ~/.aws/credentials) under the config's
   `profile`, else `AWS_PROFILE`, else `default`; the region from ~/.aws/config (`AWS_CONFIG_FILE`).
Nothing found means "let the SDK find them" (instance metadata, web identity), which obstore does.
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

REDACTED = "***"


@dataclass(frozen=True, slots=True)
class Secret:
    """A credential. `repr`, `str` and f-strings show `***`; only `reveal()` gives the value."""

    _value: str = field(repr=False)

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({REDACTED!r})"

    def __str__(self) -> str:
        return REDACTED

    def __format__(self, spec: str) -> str:
        return REDACTED


@dataclass(frozen=True, slots=True)
class AwsCredentials:
    access_key_id: str
    secret_access_key: Secret
    session_token: Secret | None = None
    source: str = ""

    def __repr__(self) -> str:
        return f"AwsCredentials(access_key_id={self.access_key_id!r}, source={self.source!r})"


def _shared_file(env: Mapping[str, str], var: str, default: str) -> Path:
    explicit = env.get(var)
    return Path(explicit) if explicit else Path(env.get("HOME", str(Path.home()))) / ".aws" / default


def _read_ini(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    if path.is_file():
        parser.read(path)
    return parser


def resolve_aws_credentials(
    *,
    profile: str | None = None,
    access_key_id_env: str | None = None,
    secret_access_key_env: str | None = None,
    session_token_env: str | None = None,
    env: Mapping[str, str] | None = None,
) -> AwsCredentials | None:
    """Static S3 credentials from the usual places (see the module docstring), or None."""
    env = os.environ if env is None else env
    if access_key_id_env and secret_access_key_env:
        key, secret = env.get(access_key_id_env), env.get(secret_access_key_env)
        if key and secret:
            token = env.get(session_token_env) if session_token_env else None
            return AwsCredentials(
                key, Secret(secret), Secret(token) if token else None, f"env:{access_key_id_env}"
            )
    if profile is None and env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        token = env.get("AWS_SESSION_TOKEN")
        return AwsCredentials(
            env["AWS_ACCESS_KEY_ID"],
            Secret(env["AWS_SECRET_ACCESS_KEY"]),
            Secret(token) if token else None,
            "env:AWS_ACCESS_KEY_ID",
        )
    name = profile or env.get("AWS_PROFILE") or "default"
    creds = _read_ini(_shared_file(env, "AWS_SHARED_CREDENTIALS_FILE", "credentials"))
    if creds.has_section(name):
        section = creds[name]
        key, secret = section.get("aws_access_key_id"), section.get("aws_secret_access_key")
        if key and secret:
            token = section.get("aws_session_token")
            return AwsCredentials(key, Secret(secret), Secret(token) if token else None, f"profile:{name}")
    return None


def resolve_aws_region(*, profile: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if env is None else env
    if env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"):
        return env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    name = profile or env.get("AWS_PROFILE") or "default"
    config = _read_ini(_shared_file(env, "AWS_CONFIG_FILE", "config"))
    section = name if name == "default" else f"profile {name}"
    if config.has_section(section):
        return config[section].get("region")
    return None
