"""Server-side apply and the patch types (API concepts, "Server-Side Apply"; "Update API Objects in
Place Using kubectl patch").

- Server-side apply creates or updates, records the field manager in `managedFields`, and refuses a
  change to a field another manager owns with 409 Conflict unless forced (`--force-conflicts`).
- A strategic merge patch merges lists by their patch merge key: a Service's `ports` by `port`, a
  pod's `containers` by `name`; a JSON merge patch replaces the list whole.
"""

from __future__ import annotations

import json

from tests.contract.kube.kubectl import Kubectl
from tests.contract.kube.manifests import configmap, dump, service


def test_server_side_apply_creates_updates_and_records_the_manager(kubectl: Kubectl, ns: str) -> None:
    kubectl(
        "apply",
        "--server-side",
        "--field-manager=team-a",
        "-n",
        ns,
        "-f",
        "-",
        stdin=dump(configmap("ssa", {"a": "1"})),
    )
    kubectl(
        "apply",
        "--server-side",
        "--field-manager=team-a",
        "-n",
        ns,
        "-f",
        "-",
        stdin=dump(configmap("ssa", {"a": "2", "b": "3"})),
    )
    got = json.loads(kubectl("get", "configmap", "ssa", "-n", ns, "-o", "json", "--show-managed-fields"))
    assert got["data"] == {"a": "2", "b": "3"}
    managers = {m["manager"] for m in got["metadata"].get("managedFields", [])}
    assert "team-a" in managers
    assert any(m.get("operation") == "Apply" for m in got["metadata"]["managedFields"])


def test_server_side_apply_conflicts_and_force(kubectl: Kubectl, ns: str) -> None:
    kubectl(
        "apply",
        "--server-side",
        "--field-manager=team-a",
        "-n",
        ns,
        "-f",
        "-",
        stdin=dump(configmap("owned", {"a": "1"})),
    )
    result = kubectl.run(
        "apply",
        "--server-side",
        "--field-manager=team-b",
        "-n",
        ns,
        "-f",
        "-",
        stdin=dump(configmap("owned", {"a": "9"})),
        check=False,
    )
    assert result.returncode != 0
    assert "conflict" in result.stderr.lower()
    assert json.loads(kubectl("get", "configmap", "owned", "-n", ns, "-o", "json"))["data"] == {"a": "1"}
    kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=team-b",
        "-n",
        ns,
        "-f",
        "-",
        stdin=dump(configmap("owned", {"a": "9"})),
    )
    assert json.loads(kubectl("get", "configmap", "owned", "-n", ns, "-o", "json"))["data"] == {"a": "9"}


def test_strategic_merge_patch_merges_service_ports_by_port(kubectl: Kubectl, ns: str) -> None:
    kubectl("apply", "-n", ns, "-f", "-", stdin=dump(service("web", [80])))
    kubectl(
        "patch",
        "service",
        "web",
        "-n",
        ns,
        "-p",
        '{"spec":{"ports":[{"name":"p81","port":81,"targetPort":81,"protocol":"TCP"}]}}',
    )
    ports = json.loads(kubectl("get", "service", "web", "-n", ns, "-o", "json"))["spec"]["ports"]
    assert sorted(p["port"] for p in ports) == [80, 81]
    # The same patch as a JSON merge patch replaces the list.
    kubectl(
        "patch",
        "service",
        "web",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec":{"ports":[{"name":"p82","port":82,"targetPort":82,"protocol":"TCP"}]}}',
    )
    ports = json.loads(kubectl("get", "service", "web", "-n", ns, "-o", "json"))["spec"]["ports"]
    assert [p["port"] for p in ports] == [82]


def test_strategic_merge_patch_deletes_by_directive(kubectl: Kubectl, ns: str) -> None:
    kubectl("apply", "-n", ns, "-f", "-", stdin=dump(service("api", [80, 443])))
    kubectl("patch", "service", "api", "-n", ns, "-p", '{"spec":{"ports":[{"port":80,"$patch":"delete"}]}}')
    ports = json.loads(kubectl("get", "service", "api", "-n", ns, "-o", "json"))["spec"]["ports"]
    assert [p["port"] for p in ports] == [443]


def test_client_side_apply_three_way_merge(kubectl: Kubectl, ns: str) -> None:
    # kubectl apply (client side) removes what the previous apply set and the new one dropped.
    kubectl("apply", "-n", ns, "-f", "-", stdin=dump(configmap("csa", {"a": "1", "b": "2"})))
    kubectl("apply", "-n", ns, "-f", "-", stdin=dump(configmap("csa", {"a": "1"})))
    assert json.loads(kubectl("get", "configmap", "csa", "-n", ns, "-o", "json"))["data"] == {"a": "1"}
