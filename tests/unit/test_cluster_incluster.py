"""Inside a pod, gpufed reaches the cluster it runs in through the mounted token and CA.

The in-cluster paths are pointed at files this test writes, and the address comes from the same
environment variables the kubelet sets; the client then talks to a simulated cluster over TLS with
that token, as the ServiceAccount the token belongs to (RBAC decides, not the simulator's admin).
"""

from __future__ import annotations

import base64
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from clusters.kubernetes import incluster
from clusters.kubernetes.kube import KubeApi, Timeouts, api_client, call
from clusters.kubernetes.permissions import cluster_role_rules
from clusters.sim import ThreadedSim
from clusters.sim.config import from_mapping
from clusters.sim.resources import CLUSTER_ROLE_BINDINGS, CLUSTER_ROLES, NAMESPACES, SECRETS, SERVICE_ACCOUNTS


@pytest.fixture
def mounts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    monkeypatch.setattr(incluster, "TOKEN_PATH", token)
    monkeypatch.setattr(incluster, "CA_PATH", ca)
    return token, ca


def test_the_client_takes_the_pods_address_token_and_ca(
    mounts: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    token, ca = mounts
    token.write_text("pod-token")
    ca.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    client = api_client(None, None, pool_size=2)
    try:
        configuration = client.configuration
        assert configuration.host == "https://10.96.0.1:443"
        assert configuration.ssl_ca_cert == str(ca)
        header = configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
        assert header.lower() == "bearer pod-token"
    finally:
        client.close()


def test_a_record_that_says_in_cluster_outside_a_pod_is_refused_naming_what_is_missing(
    mounts: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(incluster.NotInCluster, match="KUBERNETES_SERVICE_HOST"):
        api_client(Path(incluster.IN_CLUSTER), None, pool_size=2)


def test_outside_a_pod_nothing_is_in_cluster(
    mounts: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    token, _ = mounts
    token.write_text("pod-token")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert not incluster.available()
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    token.unlink()
    assert not incluster.available(), "no mounted token: not in a pod either"


def test_in_cluster_config_reaches_the_cluster_as_the_pods_account(
    mounts: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    token, ca = mounts
    pool = {"name": "a100", "gpuType": "A100", "kind": "private", "gpusPerNode": 8, "nodes": 1}
    config = from_mapping(
        {"name": "home", "provider": "private", "token": "admin", "tls": True, "pools": [pool]}
    )
    with ThreadedSim(config) as sim:
        store = sim.cluster.engine.store

        def grant() -> None:
            store.create(NAMESPACES, {"metadata": {"name": "gpufed"}})
            store.create(SERVICE_ACCOUNTS, {"metadata": {"name": "gpufed", "namespace": "gpufed"}})
            store.create(
                SECRETS,
                {
                    "metadata": {
                        "name": "t",
                        "namespace": "gpufed",
                        "annotations": {"kubernetes.io/service-account.name": "gpufed"},
                    },
                    "type": "kubernetes.io/service-account-token",
                    "data": {"token": base64.b64encode(b"pod-token").decode()},
                },
            )
            store.create(CLUSTER_ROLES, {"metadata": {"name": "m"}, "rules": cluster_role_rules()})
            store.create(
                CLUSTER_ROLE_BINDINGS,
                {
                    "metadata": {"name": "m"},
                    "roleRef": {"kind": "ClusterRole", "name": "m"},
                    "subjects": [{"kind": "ServiceAccount", "name": "gpufed", "namespace": "gpufed"}],
                },
            )

        sim.call(grant)
        kubeconfig = yaml.safe_load(sim.kubeconfig(tmp_path / "admin.kubeconfig").read_text())
        ca.write_bytes(base64.b64decode(kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"]))
        token.write_text("pod-token")
        address = urlsplit(sim.url)
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", str(address.hostname))
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(address.port))
        # As a cluster record names it (`kubeconfig: in-cluster`).
        client = api_client(Path(incluster.IN_CLUSTER), None, pool_size=2)
        api = KubeApi(client, Timeouts(5, 10))
        try:
            nodes = api.list_page(KubeApi.list_nodes, label_selector=None, limit=10, token=None)
            assert [n["metadata"]["name"] for n in nodes["items"]] == ["home-a100-0"]
            # As the pod's account, not the admin: beyond the list (secrets), refused.
            with pytest.raises(ApiException) as refused:
                call(client, "GET", "/api/v1/namespaces/gpufed/secrets", timeout=(5, 10))
            assert refused.value.status == 403
        finally:
            api.close()
