"""Run by kubernetes-validate's own virtualenv (Makefile, `deploy-tools`), not by pytest: checks every
object of the given multi-document YAML files against the Kubernetes schemas of each version, in
strict mode (a field the schema does not know is an error), and prints the failures as JSON lines.

    .venv-kubevalidate/bin/python tests/deploy/kube_validate.py 1.29.0,1.35.0 render.yaml ...
"""

import functools
import json
import sys

# kubernetes-validate is installed only in .venv-kubevalidate, which runs this script; the project's
# virtualenv, where mypy runs, cannot import it (and it ships no type information anyway).
import kubernetes_validate  # type: ignore[import-not-found]
import kubernetes_validate.utils  # type: ignore[import-not-found]
import yaml

# `validate` reads and parses the version's `_definitions.json` (megabytes) and the kind's schema on
# every call: 33 objects on seven versions took 7 s alone and 25 s in a full run. The files do not
# change within a run, so each is read once; the validation itself is the library's, unchanged.
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(
    kubernetes_validate.utils.schema_contents
)


def main() -> int:
    versions = sys.argv[1].split(",")
    checked = 0
    for path in sys.argv[2:]:
        with open(path) as f:
            docs = [doc for doc in yaml.safe_load_all(f) if doc]
        for doc in docs:
            for version in versions:
                checked += 1
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except kubernetes_validate.ValidationError as error:
                    where = "/".join(str(p) for p in error.path)
                    print(
                        json.dumps(
                            {
                                "file": path,
                                "kind": doc.get("kind"),
                                "name": doc["metadata"]["name"],
                                "version": version,
                                "path": where,
                                "error": error.message,
                            }
                        )
                    )
                except kubernetes_validate.SchemaNotFoundError as error:
                    print(
                        json.dumps(
                            {
                                "file": path,
                                "kind": doc.get("kind"),
                                "version": version,
                                "error": f"no schema: {error}",
                            }
                        )
                    )
    print(json.dumps({"checked": checked}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
