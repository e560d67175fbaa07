"""A replay into a store of many tests reads the history of the tests its input names only (and of the runs a drain
left open): the same rows as reading all of it (``pipeline.replay._read_seed``, ``sinks.seed.tests_only``)."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from core import encoding
from core.schema import JOB_HISTORY
from pipeline import replay
from sinks.duckdb_store import DuckDBStore
from tests.pipeline.test_replay import REPO, cifar_lines, table_contents
from tests.pipeline.test_replay_groups import TINY_GROUPS, messy_input
from tests.sinks.test_seed_reads import interrupted_row
from tests.support import T0
from transforms import sources

DRAINED = "test-drained"  # a test the second input does not name, with a run a drained streaming job left open


def store_after_first_input(tmp_path) -> str:
    runs = cifar_lines()
    inputs = tmp_path / "in"
    inputs.mkdir()
    first = messy_input(inputs, "first", runs[:8])
    summary = replay.run([f"--input_files={first}", f"--config_dir={REPO}/configs", "--no_progress",
                          f"--local_store={tmp_path / 'first.duckdb'}", f"--alerts_file={tmp_path / 'first.jsonl'}"])
    assert summary.rows_added["alerts"] > 0
    store = DuckDBStore(str(tmp_path / "first.duckdb"))
    store.insert(JOB_HISTORY, [interrupted_row(DRAINED, f"{DRAINED}-1", T0 + 100, [(1.0, T0 + 10)])[0]])
    store.close()
    return messy_input(inputs, "second", runs[8:])


def test_the_seed_of_the_named_tests_is_the_whole_seed_s_part_for_them(tmp_path):
    second = store_after_first_input(tmp_path)
    store = DuckDBStore(str(tmp_path / "first.duckdb"))
    configs = replay.read_config_dir(f"{REPO}/configs").strict().latest
    named = sources.survey_lines([second]).tests
    assert named is not None and sources.survey_lines([second], test_limit=len(named)).tests == named
    assert sources.survey_lines([second], test_limit=len(named) - 1).tests is None
    whole = store.read_seed(configs)
    assert set(whole.jobs) - named - {DRAINED}  # the store holds tests the input does not name
    scoped = store.read_seed(configs, named)
    wanted = named | {DRAINED}
    assert scoped.open_runs and set(scoped.open_runs) == set(whole.open_runs)
    assert without_actions(scoped) == without_actions(whole.of_tests(wanted.__contains__))
    assert scoped.stored_actions and scoped.stored_actions <= whole.stored_actions
    assert without_actions(store.read_seed(configs, ())) == without_actions(whole.of_tests({DRAINED}.__contains__))


def without_actions(seed):
    """The seed's parts as bytes (a dict's by key: their order follows the store's row order), but for its
    ``stored_actions`` (a scoped seed's are those of its tests only)."""
    def described(value):
        if isinstance(value, dict):
            return {key: encoding.encode(item) for key, item in value.items()}
        return encoding.encode(value)
    return {field.name: described(getattr(seed, field.name)) for field in dataclasses.fields(seed)
            if field.name != "stored_actions"}


@pytest.mark.long
@pytest.mark.parametrize("grouping", ["--replay_group_mib=0", TINY_GROUPS], ids=["one group", "groups"])
def test_a_replay_with_the_seed_of_its_tests_gives_the_rows_of_the_whole_seed(tmp_path, monkeypatch, grouping):
    second = store_after_first_input(tmp_path)
    for name, above in (("scoped", 0), ("whole", 10 ** 9)):
        shutil.copy(tmp_path / "first.duckdb", tmp_path / f"{name}.duckdb")
        shutil.copy(tmp_path / "first.jsonl", tmp_path / f"{name}.jsonl")
        monkeypatch.setattr(replay, "SCOPED_SEED_ABOVE_TESTS", above)
        replay.run([f"--input_files={second}", f"--config_dir={REPO}/configs", "--no_progress", grouping,
                    f"--local_store={tmp_path / name}.duckdb", f"--alerts_file={tmp_path / name}.jsonl"])
    scoped = table_contents(tmp_path / "scoped.duckdb")
    assert scoped == table_contents(tmp_path / "whole.duckdb")
    assert (tmp_path / "scoped.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    assert scoped["triage"] and scoped["dead_letter"] and len(scoped["alerts"]) >= 10
