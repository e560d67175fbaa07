"""Step names and coders are part of the running job's contract: ``--update`` matches the new graph's steps to
the running job's by name, and refuses (or loses the state of) a step whose name changed without a mapping; it
refuses a job whose PCollections' coders changed, and a coder that reads the same bytes differently would corrupt
what is in flight.

``tests/pipeline/step_names.txt`` is the committed list of the streaming job's step names. A change to it is a
deliberate one: a step that is renamed or moved gets an entry old name -> new name in
``pipeline/transform_name_mapping.json``, which ``run_dataflow.sh --update`` passes to Dataflow as
``--transform_name_mapping``. Regenerate the list with ``TRAINGUARD_WRITE_STEP_NAMES=1 pytest <this file>``.

``tests/pipeline/coders.txt`` is the committed coder of every output of every step, by the coders' classes (a
pickled coder by its module and class, as the worker unpickles it). A change there is deliberate too: the
records' own encoding is versioned (``transforms/coders.py``, the state fixtures), the coder around them is not.
Regenerate it with ``TRAINGUARD_WRITE_CODERS=1 pytest <this file>``.
"""

import json
import os
import re
from typing import Any, List

import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability import python_urns
from apache_beam.runners import pipeline_context

from core.locations import CONFIG_DIR
from pipeline.streaming import StreamingJobConfig, build_streaming_pipeline
from tests.support import REPO_ROOT
from transforms.config_versions import read_config_dir

NAMES_FILE = os.path.join(REPO_ROOT, "tests", "pipeline", "step_names.txt")
CODERS_FILE = os.path.join(REPO_ROOT, "tests", "pipeline", "coders.txt")
MAPPING_FILE = os.path.join(REPO_ROOT, "pipeline", "transform_name_mapping.json")
GENERATED = re.compile(r"<lambda|<function|:\d+>|\bat 0x|Map\(<|FlatMap\(<")


def streaming_graph() -> Any:
    """The streaming job's graph as ``run_dataflow.sh`` deploys it, in its runner API form."""
    options = PipelineOptions([
        "--streaming", "--input_subscription=projects/my-project/subscriptions/trainguard-metrics-pipeline",
        "--alerts_topic=projects/my-project/topics/trainguard-alerts", "--bigquery_project=my-project",
        "--bigquery_dataset=trainguard", "--write_method=streaming_inserts"])
    pipeline = build_streaming_pipeline(options, read_config_dir(CONFIG_DIR), StreamingJobConfig.from_options(options))
    return pipeline.to_runner_api()


def step_names(graph: Any) -> List[str]:
    """Every step of the streaming job as Dataflow names it (its full, unique name), sorted."""
    return sorted({t.unique_name for t in graph.components.transforms.values() if t.unique_name})


def step_coders(graph: Any) -> List[str]:
    """``step:output = coder`` for every output of every step, sorted; a coder by its URN's name and its
    components', a pickled one by its class (and the version tag Beam's update-compatible coders carry)."""
    components = graph.components
    context = pipeline_context.PipelineContext(components)

    def described(coder_id: str) -> str:
        spec = components.coders[coder_id]
        name = spec.spec.urn.split(":")[-2]
        if spec.spec.urn == python_urns.PICKLED_CODER:
            coder = context.coders.get_by_id(coder_id)
            name = f"{type(coder).__module__}.{type(coder).__qualname__}"
            version = getattr(coder, "_version_tag", None)
            if version:
                name += f"[{version}]"
        parts = [described(component) for component in spec.component_coder_ids]
        return f"{name}({', '.join(parts)})" if parts else name

    return sorted({f"{t.unique_name}:{tag} = {described(components.pcollections[pc].coder_id)}"
                   for t in components.transforms.values() if t.unique_name for tag, pc in t.outputs.items()})


@pytest.fixture(scope="module")
def graph():
    return streaming_graph()


@pytest.fixture(scope="module")
def names(graph):
    return step_names(graph)


@pytest.fixture(scope="module")
def coders(graph):
    return step_coders(graph)


def committed(path: str, regenerate: str, current: List[str]) -> List[str]:
    """The committed lines of ``path``, written from ``current`` first when the variable ``regenerate`` is set."""
    if os.environ.get(regenerate):
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in current))
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def test_no_step_is_named_after_a_lambda_or_a_line_number(names):
    generated = [name for name in names if GENERATED.search(name)]
    assert not generated, "label these steps (a lambda's or a function's name moves with the code):\n" + "\n".join(
        generated)


def test_the_step_names_are_the_committed_ones(names):
    listed = committed(NAMES_FILE, "TRAINGUARD_WRITE_STEP_NAMES", names)
    with open(MAPPING_FILE, encoding="utf-8") as f:
        mapping = json.load(f)
    gone, new = sorted(set(listed) - set(names)), sorted(set(names) - set(listed))
    unmapped = [name for name in gone if not any(name == old or name.startswith(old + "/") for old in mapping)]
    assert not unmapped, ("steps renamed without an entry in pipeline/transform_name_mapping.json (--update would "
                          "not find their state):\n" + "\n".join(unmapped))
    assert not new and not gone, (
        "the streaming job's steps changed; if that is deliberate, map renamed steps in "
        "pipeline/transform_name_mapping.json and regenerate tests/pipeline/step_names.txt "
        "(TRAINGUARD_WRITE_STEP_NAMES=1)\nnew:\n" + "\n".join(new) + "\ngone:\n" + "\n".join(gone))


def test_the_coders_are_the_committed_ones(coders):
    changed = sorted(set(committed(CODERS_FILE, "TRAINGUARD_WRITE_CODERS", coders)) ^ set(coders))
    assert not changed, (
        "the streaming job's coders changed, which --update refuses or, for a coder that reads the same bytes "
        "otherwise, corrupts what is in flight; if that is deliberate, regenerate tests/pipeline/coders.txt "
        "(TRAINGUARD_WRITE_CODERS=1) and say how a running job moves over\n" + "\n".join(changed))


def test_the_coders_name_no_pickled_class_of_the_project_but_the_record_coder(coders):
    """State and shuffles are a file format: a pickle of one of our classes would not survive a refactor."""
    ours = ("core.", "transforms.", "sinks.", "pipeline.", "trainguard.")
    pickled = {line.split(" = ", 1)[1] for line in coders}
    classes = {part.strip("()[], ") for coder in pickled for part in coder.replace("(", " ").split()}
    assert {c for c in classes if c.startswith(ours)} == {"transforms.coders.RecordCoder"}


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
