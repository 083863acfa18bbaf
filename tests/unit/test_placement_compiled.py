"""The placer's compiled form (mypyc; `placement/_compiled.py`, `tools/compile_placement.py`).

- Compiled and interpreted, the placer plans the bytes recorded before issue 33's work
  (`data/placer_cycles_golden.json`), cycle after cycle, each form in a process of its own.
- A build is run only with the sources it was built from: after an edit to any source (a compiled
  module's or the model's, which the compiled code relies on) the interpreted sources run, and nothing
  of the old build is loaded.
- The checks of test_plan_cycles that patch the sources' functions (the victim search without its
  shortcuts) test nothing in a compiled process (compiled modules call each other directly): where
  this process runs compiled, they run again on the interpreted sources.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from federation.store.records import SchedulingSettings
from placement import _compiled
from placement.gpu_types import BUILTIN_TYPES
from placement.model import CapacityKind, ClusterName, GpuType
from placement.reserve import PendingGang
from tests.unit.plan_cycles import GOLDEN, WEEK

ROOT = Path(__file__).resolve().parents[2]
KEPT = json.loads(GOLDEN.read_text())
BUILT = _compiled.build_dir().is_dir()
NOT_BUILT = "no build of these sources (`make setup` builds one where a C compiler is found)"


def _python(code: str, *, compiled: bool, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, _compiled.ENV: "1" if compiled else "0", "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


DIGESTS = """
import json, placement
from placement.plan import plan
from tests.unit.plan_cycles import WEEK, bench_cycles, digest, replay_cycles
out = {"compiled": placement.COMPILED}
out["bench_3000x8"] = [digest(p) for _, _, p in bench_cycles(3000, 8, lambda s, now: plan(s, now=now))]
if WEEK.exists():
    out["replay_gpufed_250"] = [digest(plan(s, now=now)) for s, now in replay_cycles(250, "gpufed")]
print(json.dumps(out))
"""


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "interpreted"])
def test_each_form_plans_the_recorded_bytes(compiled: bool) -> None:
    """The busy federation's eight cycles (a cold one, then steady ones with preemptions), and a
    replayed week's cycles where the week is on the machine."""
    if compiled and not BUILT:
        pytest.skip(NOT_BUILT)
    done = _python(DIGESTS, compiled=compiled)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out.pop("compiled") is compiled
    assert out["bench_3000x8"] == KEPT["bench_3000x8"]
    if WEEK.exists():
        assert out["replay_gpufed_250"] == KEPT["replay_gpufed_250"]


FORM = """
import placement, placement.plan, placement.preempt
from tests.unit.placement_builders import SnapshotBuilder
from placement.plan import plan
plan(SnapshotBuilder().build(), now=0.0)
print(placement.COMPILED, placement.__file__, placement.plan.__file__, placement.preempt.__file__)
"""


def _copy(tmp_path: Path) -> tuple[Path, bool]:
    """The package, the tests' builders and a build of the package's sources under tmp_path; whether
    the build is a real one (else garbage in its place)."""
    shutil.copytree(ROOT / "placement", tmp_path / "placement", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    for name in ("__init__.py", "unit/__init__.py", "unit/placement_builders.py"):
        shutil.copy2(ROOT / "tests" / name, tmp_path / "tests" / name)
    built = _compiled.build_dir(tmp_path / "placement")
    # The build of the copied sources (the same name as ROOT's, as they are the same bytes).
    real = ROOT / ".compiled" / built.name
    if real.is_dir():
        shutil.copytree(real, built)
    else:
        # Garbage where the libraries would be: a process that loaded any of it would fail to import.
        suffix = _compiled.extension_suffix()
        (built / "placement").mkdir(parents=True)
        for name in _compiled.COMPILED:
            (built / "placement" / f"{name}{suffix}").write_bytes(b"not a library")
        (built / f"0000__mypyc{suffix}").write_bytes(b"not a library")
    return built, real.is_dir()


@pytest.mark.parametrize("edited", ["plan.py", "model.py"])
def test_a_build_of_other_sources_is_never_run(tmp_path: Path, edited: str) -> None:
    """A copy of the package with the build of its sources beside it runs compiled; once one of its
    sources is edited (a compiled module, or the model they were compiled against), the interpreted
    sources run, and the old build's libraries are not loaded at all."""
    built, real = _copy(tmp_path)
    before = _python(FORM, compiled=True, cwd=tmp_path)
    if real:
        assert before.returncode == 0, before.stderr[-3000:]
        compiled, package, plan_file, preempt_file = before.stdout.split()
        assert (compiled, package) == ("True", str(tmp_path / "placement" / "__init__.py"))
        assert plan_file.startswith(str(built))
        assert preempt_file.startswith(str(built))
    else:  # the planted garbage is what this build directory would load
        assert before.returncode != 0

    source = tmp_path / "placement" / edited
    source.write_text(source.read_text() + "\n# edited after the build\n")
    after = _python(FORM, compiled=True, cwd=tmp_path)
    assert after.returncode == 0, after.stderr[-3000:]
    compiled, package, plan_file, preempt_file = after.stdout.split()
    assert compiled == "False"
    assert (plan_file, preempt_file) == (
        str(tmp_path / "placement" / "plan.py"),
        str(tmp_path / "placement" / "preempt.py"),
    )


def test_the_switch_runs_the_sources_whatever_is_built(tmp_path: Path) -> None:
    """`GPUFED_PLACEMENT_COMPILED=0`: the interpreted sources, even beside a build of them."""
    _copy(tmp_path)
    done = _python(FORM, compiled=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[0] == "False"
    assert done.stdout.split()[2] == str(tmp_path / "placement" / "plan.py")


def test_the_federations_values_copy_and_pickle() -> None:
    """Placement classes the federation keeps as values stay interpreted: mypyc's native frozen
    dataclasses can be neither deep-copied nor unpickled, and the scheduling settings (with the
    admin's GPU types) go to the API workers as a pickle (federation/runtime/api_workers.py)."""
    gpu = replace(BUILTIN_TYPES[0], name=GpuType("B300"))
    settings = SchedulingSettings(gpu_types=(gpu,))
    pending = PendingGang(ClusterName("dc-1"), GpuType("H100"), CapacityKind.PRIVATE, (8, 8))
    for value in (settings, pending):
        assert pickle.loads(pickle.dumps(value)) == value
        assert copy.deepcopy(value) == value
    assert {"gpu_types", "reserve"}.isdisjoint(_compiled.COMPILED)
