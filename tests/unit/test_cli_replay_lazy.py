"""`gpufed replay` imports the replay's modules when it runs, not when any `gpufed` command starts
(`gpufed serve` would pay for the simulator and the plots on every restart)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from federation.cli.main import cli


def test_starting_the_command_line_imports_no_replay_module_but_its_errors() -> None:
    code = (
        "import sys, federation.cli.main; "
        "print(sorted(m for m in sys.modules if m.startswith('federation.replay')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['federation.replay', 'federation.replay.errors']"


def test_replay_still_runs_its_config_loader(tmp_path: Path) -> None:
    config = tmp_path / "replay.yaml"
    config.write_text("policies: [\n")
    result = CliRunner().invoke(cli, ["replay", "--config", str(config), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1, result.output
    assert "cannot read the config" in result.output
