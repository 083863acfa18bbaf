"""docs/outputs.md holds to what gpufed does: its TrainingJob examples parse as written, with the
outputs they show, and the submission errors it quotes are gpufed's own words."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from federation.errors import InvalidSpec
from federation.spec.jobspec import OutputSpec
from federation.spec.training_job import parse_manifest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "outputs.md"


def yaml_blocks() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)


def test_the_guides_jobs_parse_with_their_outputs() -> None:
    prep, train = (parse_manifest(text, priority_classes=["normal"]) for text in yaml_blocks())
    assert prep.outputs == (OutputSpec("tokens", "vision/tokens/", "v1"),)
    assert (str(train.dataset), train.outputs) == (
        "tokens@v1",
        (OutputSpec("model", "vision/models/", "m1"),),
    )


@pytest.mark.parametrize(
    ("outputs", "quoted"),
    [
        (
            [{"dataset": "nlp/corpus", "path": "vision/x/"}],
            "spec.outputs[0].dataset: must be a dataset of the job's own tenant (a bare name): a job cannot\n"
            "  write into another tenant's dataset, got 'nlp/corpus'",
        ),
        (
            [{"dataset": "a", "path": "vision/a/"}, {"dataset": "b", "path": "vision/a/b"}],
            "spec.outputs[1].path: 'vision/a/b/' overlaps spec.outputs[0].path 'vision/a/': each output needs a\n"
            "  prefix of its own",
        ),
    ],
    ids=["another-tenants-dataset", "overlapping-prefixes"],
)
def test_the_quoted_errors_are_gpufeds(outputs: list[dict[str, str]], quoted: str) -> None:
    doc = yaml.safe_load(yaml_blocks()[0])
    doc["spec"]["outputs"] = outputs
    with pytest.raises(InvalidSpec) as refused:
        parse_manifest(yaml.safe_dump(doc), priority_classes=["normal"])
    assert quoted in PAGE.read_text()
    assert str(refused.value) == quoted.replace("\n  ", " ")
