"""Step names are part of the running job's contract: ``--update`` matches the new graph's steps to the running
job's by name, and refuses (or loses the state of) a step whose name changed without a mapping.

``tests/pipeline/step_names.txt`` is the committed list of the streaming job's step names. A change to it is a
deliberate one: a step that is renamed or moved gets an entry old name -> new name in
``pipeline/transform_name_mapping.json``, which ``run_dataflow.sh --update`` passes to Dataflow as
``--transform_name_mapping``. Regenerate the list with ``TRAINGUARD_WRITE_STEP_NAMES=1 pytest <this file>``.
"""

import json
import os
import re

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from core.locations import CONFIG_DIR
from pipeline.streaming import StreamingJobConfig, build_streaming_pipeline
from tests.support import REPO_ROOT
from transforms.config_versions import read_config_dir

NAMES_FILE = os.path.join(REPO_ROOT, "tests", "pipeline", "step_names.txt")
MAPPING_FILE = os.path.join(REPO_ROOT, "pipeline", "transform_name_mapping.json")
GENERATED = re.compile(r"<lambda|<function|:\d+>|\bat 0x|Map\(<|FlatMap\(<")


def streaming_step_names() -> list:
    """Every step of the streaming job as Dataflow names it (its full, unique name), in graph order."""
    options = PipelineOptions([
        "--streaming", "--input_subscription=projects/my-project/subscriptions/trainguard-metrics-pipeline",
        "--alerts_topic=projects/my-project/topics/trainguard-alerts", "--bigquery_project=my-project",
        "--bigquery_dataset=trainguard", "--write_method=streaming_inserts"])
    pipeline = build_streaming_pipeline(options, read_config_dir(CONFIG_DIR), StreamingJobConfig.from_options(options))
    transforms = pipeline.to_runner_api().components.transforms
    return sorted({t.unique_name for t in transforms.values() if t.unique_name})


@pytest.fixture(scope="module")
def names():
    return streaming_step_names()


def test_no_step_is_named_after_a_lambda_or_a_line_number(names):
    generated = [name for name in names if GENERATED.search(name)]
    assert not generated, "label these steps (a lambda's or a function's name moves with the code):\n" + "\n".join(
        generated)


def test_the_step_names_are_the_committed_ones(names):
    if os.environ.get("TRAINGUARD_WRITE_STEP_NAMES"):
        with open(NAMES_FILE, "w", encoding="utf-8") as f:
            f.write("".join(name + "\n" for name in names))
    with open(NAMES_FILE, encoding="utf-8") as f:
        committed = f.read().splitlines()
    with open(MAPPING_FILE, encoding="utf-8") as f:
        mapping = json.load(f)
    gone, new = sorted(set(committed) - set(names)), sorted(set(names) - set(committed))
    unmapped = [name for name in gone if not any(name == old or name.startswith(old + "/") for old in mapping)]
    assert not unmapped, ("steps renamed without an entry in pipeline/transform_name_mapping.json (--update would "
                          "not find their state):\n" + "\n".join(unmapped))
    assert not new and not gone, (
        "the streaming job's steps changed; if that is deliberate, map renamed steps in "
        "pipeline/transform_name_mapping.json and regenerate tests/pipeline/step_names.txt "
        "(TRAINGUARD_WRITE_STEP_NAMES=1)\nnew:\n" + "\n".join(new) + "\ngone:\n" + "\n".join(gone))


def test_the_mapping_names_steps_that_exist(names):
    with open(MAPPING_FILE, encoding="utf-8") as f:
        mapping = json.load(f)
    assert all(any(n == new or n.startswith(new + "/") for n in names) for new in mapping.values()), mapping


def test_the_committed_names_are_those_of_the_pinned_beam():
    """Beam renames its own steps between versions: setup.py pins it exactly, and the committed names are this
    version's (a Beam upgrade regenerates them and maps what moved)."""
    import apache_beam

    with open(os.path.join(REPO_ROOT, "setup.py"), encoding="utf-8") as f:
        pinned = re.search(r'"apache-beam\[gcp\]==([0-9.]+)"', f.read())
    assert pinned, "setup.py must pin apache-beam[gcp] to one version"
    assert apache_beam.__version__ == pinned.group(1)
