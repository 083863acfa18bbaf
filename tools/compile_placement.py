"""Compile the placer's decision modules with mypyc into `.compiled/placement-KEY/` (`make setup`).

    python tools/compile_placement.py            # build if the sources changed; skip without a compiler
    python tools/compile_placement.py --require  # fail, rather than skip, when it cannot build

KEY is the digest of the package's sources (`placement/_compiled.py`, which also says which modules
are compiled and why the model's are not). Nothing is written beside the sources: the sources are
copied into a scratch directory, compiled there with mypyc's own command, and the built libraries
moved into a new directory named for the copy's key, in one rename. So an edit made during the build
leaves the build keyed to the sources it was made from (unused until they come back), a build that
stops halfway leaves nothing that is read, and a process that already runs an older build keeps its
files (only directories of other keys are removed, and open libraries stay readable once unlinked).

Without a C compiler, Python's headers or mypyc, it says why and leaves the interpreted sources to
run (same plans, slower); the exit status is 0 unless `--require`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from placement import _compiled  # noqa: E402


def missing_tools() -> str | None:
    """Why this machine cannot build, or None."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler} is not on PATH)"
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.is_file():
        return f"no Python headers ({headers} is missing; Debian: python3-dev)"
    mypyc = Path(sys.executable).parent / "mypyc"
    if not mypyc.is_file():
        return f"no mypyc ({mypyc} is missing; it comes with mypy, a dev dependency)"
    return None


def build(builds: Path) -> Path:
    """Compile a copy of the sources; the build's directory."""
    builds.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".tmp-", dir=builds))
    try:
        source = scratch / "src" / "placement"
        source.mkdir(parents=True)
        for path in sorted(_compiled.PACKAGE_DIR.glob("*.py")):
            shutil.copy2(path, source / path.name)
        shutil.copy2(_compiled.PACKAGE_DIR / "py.typed", source / "py.typed")
        key = _compiled.sources_key(source)
        files = [f"placement/{name}.py" for name in _compiled.COMPILED]
        # mypyc's own command builds in place (libraries beside the copied sources, and the modules'
        # shared library in the working directory), with a build/ of its own in the scratch directory.
        done = subprocess.run(
            [
                str(Path(sys.executable).parent / "mypyc"),
                "--config-file",
                str(ROOT / "pyproject.toml"),
                *files,
            ],
            cwd=source.parent,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
            raise SystemExit(f"mypyc failed ({done.returncode})")
        suffix = _compiled.extension_suffix()
        built = scratch / "built"
        (built / "placement").mkdir(parents=True)
        for name in _compiled.COMPILED:
            (source / f"{name}{suffix}").rename(built / "placement" / f"{name}{suffix}")
        for library in source.parent.glob(f"*__mypyc{suffix}"):
            library.rename(built / library.name)
        final = builds / f"placement-{key}"
        try:
            built.rename(final)
        except OSError:
            if not final.is_dir():
                raise
            # Another build of the same sources (a second `make setup` at once) finished first.
        return final
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--require", action="store_true", help="fail when it cannot build")
    args = parser.parse_args()
    builds = _compiled.BUILDS_DIR
    current = _compiled.build_dir()
    if current.is_dir():
        print(f"placement compiled: up to date ({current.relative_to(ROOT)})")
        return 0
    if os.environ.get(_compiled.ENV) == "0":
        print(f"placement compiled: not built ({_compiled.ENV}=0)")
        return 0
    reason = missing_tools()
    if reason is not None:
        print(f"placement compiled: not built, {reason}; the interpreted sources run (same plans)")
        return 1 if args.require else 0
    started_wall, started_cpu = time.monotonic(), time.process_time()
    children = os.times()
    final = build(builds)
    after = os.times()
    cpu = time.process_time() - started_cpu + (after.children_user - children.children_user)
    cpu += after.children_system - children.children_system
    for other in builds.glob("placement-*"):
        if other != final:
            shutil.rmtree(other, ignore_errors=True)
    print(
        f"placement compiled: built {final.relative_to(ROOT)} in {time.monotonic() - started_wall:.0f} s "
        f"({cpu:.0f} s of CPU)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
