"""examples/federation.yaml is what the README says it is: a federation config that loads, with real
member clusters (`backend: kubernetes`, a kubeconfig and a context), not a copy of the all-simulated
default; and the README's excerpt of it is the example's own entry (issue 30, item 10)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from federation.runtime.config import load_config
from federation.runtime.embedded import default_config_path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "federation.yaml"


def test_the_example_loads_with_real_kubernetes_clusters_and_is_not_the_default() -> None:
    assert not EXAMPLE.is_symlink(), "a link to the default shows nothing the default does not"
    assert EXAMPLE.read_text() != default_config_path().read_text()
    config = load_config(EXAMPLE)
    kube = [c for c in config.clusters if c.backend == "kubernetes"]
    assert kube, "no backend: kubernetes cluster"
    for cluster in kube:
        assert cluster.kubeconfig is not None, cluster.name
        assert Path(cluster.kubeconfig).is_absolute(), cluster.name
    # Nothing in it is started by `gpufed up`: no simulated cluster, no local store server.
    assert config.simulated == ()
    assert all(store.seaweed is None for store in config.object_stores)


def test_the_readmes_excerpt_is_the_examples_entry() -> None:
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"\(`examples/federation\.yaml`\):\n\n```yaml\n(.*?)```", readme, re.S)
    assert found is not None, "the README's excerpt of examples/federation.yaml"
    excerpt = yaml.safe_load(found.group(1))["clusters"]
    example = {c["name"]: c for c in yaml.safe_load(EXAMPLE.read_text())["clusters"]}
    for shown in excerpt:
        entry = example[shown["name"]]
        for key, value in shown.items():
            if key == "pools":
                pools = {pool["name"]: pool for pool in entry["pools"]}
                for pool in value:  # the excerpt may leave a pool's optional keys out
                    assert pool.items() <= pools[pool["name"]].items(), (shown["name"], pool["name"])
            else:
                assert entry[key] == value, (shown["name"], key)
