"""In-cluster configuration: gpufed running as a pod drives the cluster it runs in with its own account.

Inside a pod there is no kubeconfig: the API's address comes from `KUBERNETES_SERVICE_HOST` and
`KUBERNETES_SERVICE_PORT`, and the pod's ServiceAccount token and the cluster's CA are mounted at
`/var/run/secrets/kubernetes.io/serviceaccount/`. A cluster record whose kubeconfig is `in-cluster`
is reached this way (`kube.api_client`), and so is one given no kubeconfig inside a pod, through the
official client's loader, which re-reads the token as the kubelet rotates it (projected tokens last
about an hour).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# What a cluster record's `kubeconfig` says to mean "the cluster this pod runs in".
IN_CLUSTER = "in-cluster"
HOST_ENV = "KUBERNETES_SERVICE_HOST"
PORT_ENV = "KUBERNETES_SERVICE_PORT"
# Where the kubelet mounts them. Read at each call, so that a test can point them at files of its own.
TOKEN_PATH = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
CA_PATH = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")


class NotInCluster(Exception):
    """No in-cluster configuration here: not in a pod, or its token or CA is not mounted."""


def available(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return bool(env.get(HOST_ENV)) and TOKEN_PATH.is_file()


def load(configuration: Any, environ: Mapping[str, str] | None = None) -> None:
    """Fill a client `Configuration` (host, CA, bearer token that refreshes) from the pod's mounts."""
    # Imported here, so that reading IN_CLUSTER costs nothing: a federation without a Kubernetes
    # member must not pay the client's import.
    from kubernetes.config import config_exception, incluster_config

    env = dict(os.environ if environ is None else environ)
    loader: Any = incluster_config.InClusterConfigLoader(
        token_filename=str(TOKEN_PATH), cert_filename=str(CA_PATH), try_refresh_token=True, environ=env
    )
    try:
        loader.load_and_set(configuration)
    except config_exception.ConfigException as error:
        raise NotInCluster(
            f"in-cluster configuration needs {HOST_ENV}, {PORT_ENV} and the pod's token and CA "
            f"under {TOKEN_PATH.parent}: {error}"
        ) from error
