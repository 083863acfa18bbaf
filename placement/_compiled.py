"""The placer's compiled form: mypyc builds of this package, used only when built from these sources.

`tools/compile_placement.py` (run by `make setup` where a C compiler is found) compiles the decision
modules (`COMPILED`) into `.compiled/placement-KEY/` beside the package, never beside the sources:
KEY is a digest of every source file of the package and of the interpreter's extension suffix. At
import, `placement/__init__.py` (always interpreted, like this module) computes the key of the sources
as they are now and puts that build's directory first on the package's path only if it exists. So an
edit to any source (the model's too: the compiled code relies on its types) leaves the old build
unused, and the interpreted sources run, with the same plans, until `make setup` builds again. It is
all or nothing: a compiled module calls the others it was compiled with directly, not through the
import system, so one stale module of a build would be run by its fresh neighbours.

`GPUFED_PLACEMENT_COMPILED=0` runs the interpreted sources whatever is built (the benchmark's and the
tests' comparisons of the two forms).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path

ENV = "GPUFED_PLACEMENT_COMPILED"
# The decision code and the model it reads: compiled, the model's values are native classes, whose
# fields the decision code reads as struct fields rather than through Python's attribute lookup (the
# steady 10,000-gang cycle 153 -> 111 ms of CPU). They copy and pickle by their constructors
# (`model_values`). Left interpreted: `model_values` itself, and `model_waiting` (`Waiting` is made by
# giving a plain object its class, which native classes do not allow).
COMPILED = (
    "backfill",
    "capacity",
    "cost",
    "explain",
    "fairshare",
    "fit",
    "gpu_types",
    "inventory",
    "model",
    "model_ids",
    "model_plan",
    "model_policy",
    "ordered",
    "plan",
    "preempt",
    "queue_carry",
    "quota",
    "reasons",
    "repatriate",
    "reserve",
    "room",
    "set_affinity",
    "stretch_carry",
    "wait_policy",
    "wait_saving",
)
PACKAGE_DIR = Path(__file__).resolve().parent
BUILDS_DIR = PACKAGE_DIR.parent / ".compiled"


def extension_suffix() -> str:
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    return suffix if isinstance(suffix, str) else ".so"


def sources_key(package_dir: Path = PACKAGE_DIR) -> str:
    """A digest of every source file of the package (name and bytes) and of the extension suffix."""
    digest = hashlib.sha256(extension_suffix().encode())
    for path in sorted(package_dir.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:24]


def build_dir(package_dir: Path = PACKAGE_DIR) -> Path:
    """Where the build of the package's sources as they are now is (or would be)."""
    return package_dir.parent / ".compiled" / f"placement-{sources_key(package_dir)}"


def load(package_path: list[str]) -> bool:
    """Put the build of these sources first on the package's path, if there is one; whether it did."""
    if os.environ.get(ENV, "1") == "0":
        return False
    built = build_dir()
    suffix = extension_suffix()
    if not all((built / "placement" / f"{name}{suffix}").is_file() for name in COMPILED):
        return False
    # The modules' shared library (mypyc's "group"), which each compiled module imports by its
    # top-level name: loaded from the build, so the build needs no entry on sys.path.
    for library in sorted(built.glob(f"*__mypyc{suffix}")):
        name = library.name[: -len(suffix)]
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, library)
        if spec is None or spec.loader is None:
            return False
        try:
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        except ImportError:  # built for another interpreter after all: the sources run
            sys.modules.pop(name, None)
            return False
    package_path.insert(0, str(built / "placement"))
    return True
