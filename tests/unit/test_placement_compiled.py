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
import copyreg
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
from placement.plan import plan
from placement.reserve import PendingGang
from tests.unit.placement_builders import dataclasses_in
from tests.unit.plan_cycles import GOLDEN, WEEK, bench_cycles

ROOT = Path(__file__).resolve().parents[2]
KEPT = json.loads(GOLDEN.read_text())
BUILT = _compiled.build_dir().is_dir()
NOT_BUILT = "no build of these sources (`make setup` builds one where a C compiler is found)"


def _python(code: str, *args: str, compiled: bool, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, _compiled.ENV: "1" if compiled else "0", "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
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


def _model_values() -> list[type[object]]:
    """Every frozen dataclass of the model's modules."""
    return dataclasses_in(("model", "model_ids", "model_plan", "model_policy", "gpu_types", "reserve"))


def test_every_model_value_is_registered_to_copy_and_pickle_by_its_constructor() -> None:
    """A model class added without `keep_as_values` would pickle in the interpreted form and fail to
    unpickle in the compiled one (mypyc's native frozen classes refuse their attributes being set back)."""
    classes = _model_values()
    assert len(classes) >= 25
    assert [c.__name__ for c in classes if copyreg.dispatch_table.get(c) is None] == []


def test_the_federations_values_copy_and_pickle() -> None:
    """The model's classes run compiled where a build exists (native classes), and the federation keeps
    them as values: the scheduling settings (with the admin's GPU types) go to the API workers as a
    pickle (federation/runtime/api_workers.py), the replay's workers get configs, and snapshots and
    plans are values. Each pickles, copies and deep-copies to an equal value."""
    gpu = replace(BUILTIN_TYPES[0], name=GpuType("B300"))
    settings = SchedulingSettings(gpu_types=(gpu,))
    pending = PendingGang(ClusterName("dc-1"), GpuType("H100"), CapacityKind.PRIVATE, (8, 8))
    (snapshot, _, decided), *_ = bench_cycles(300, 1, lambda s, now: plan(s, now=now))
    assert decided.admissions
    assert decided.waiting
    assert snapshot.running
    for value in (settings, pending, snapshot, decided, snapshot.queued[0]):
        assert pickle.loads(pickle.dumps(value)) == value
        assert copy.deepcopy(value) == value
        assert copy.copy(value) == value
    request = snapshot.queued[0]
    assert pickle.loads(pickle.dumps(request)).decision_key == request.decision_key
    # Worked out again in the loading process (string hashes differ between processes).
    assert pickle.loads(pickle.dumps(request)).decision_hash == hash(request.decision_key)


CROSS = """
import pickle, sys, placement
from placement.plan import plan
from tests.unit.plan_cycles import bench_cycles, digest
path = sys.argv[1]
if sys.argv[2] == "write":
    (snapshot, now, decided), *_ = bench_cycles(300, 1, lambda s, now: plan(s, now=now))
    open(path, "wb").write(pickle.dumps((snapshot, now, decided)))
    print(placement.COMPILED, digest(decided))
else:
    snapshot, now, decided = pickle.loads(open(path, "rb").read())
    print(placement.COMPILED, digest(decided), digest(plan(snapshot, now=now)))
"""


@pytest.mark.skipif(not BUILT, reason=NOT_BUILT)
@pytest.mark.parametrize(
    "written_compiled", [True, False], ids=["compiled-to-interpreted", "interpreted-to-compiled"]
)
def test_a_pickle_of_one_form_loads_in_the_other(tmp_path: Path, written_compiled: bool) -> None:
    """A snapshot and its plan pickled by one form load in the other, equal: the same plan again."""
    path = tmp_path / "cycle.pickle"
    wrote = _python(CROSS, str(path), "write", compiled=written_compiled)
    assert wrote.returncode == 0, wrote.stderr[-3000:]
    read = _python(CROSS, str(path), "read", compiled=not written_compiled)
    assert read.returncode == 0, read.stderr[-3000:]
    written_form, written_digest = wrote.stdout.split()
    read_form, read_digest, replanned = read.stdout.split()
    assert (written_form, read_form) == (str(written_compiled), str(not written_compiled))
    assert written_digest == read_digest == replanned
