"""Nothing is ever lost: a replay killed at any instant, then run again, leaves exactly a clean run's store and
alerts file (``sinks.local_outputs``).

The kills are real (SIGKILL, from ``sinks.crash_points`` at a named instant, or from the test after a delay): no
clean-up of the killed process runs. Each case starts from the store and alerts file of an earlier invocation, so
that a kill also has history to lose, and the rerun is the same command again.

The runs killed at an instant are forked from a ``Zygote``, a fresh interpreter that has imported
``python -m pipeline`` (Beam and the graph: a second of CPU that every run would repeat) and nothing else, and
runs the command's ``main`` in each child. The run killed after a delay is a whole ``python -m pipeline``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pathlib
import select
import shutil
import signal
import subprocess
import sys
import time

import pytest

from core.records import Alert
from core.vocabulary import AlertKind
from sinks.crash_points import CRASH_AT_ENV, CRASH_TRACE_ENV
from tests.pipeline.test_replay import REPO, cifar_lines, table_contents
from tests.pipeline.test_replay_groups import TINY_GROUPS, messy_input
from tests.support import T0
from trainguard import wire

ONE_GROUP = "--replay_group_mib=0"
MISSING_BERT = Alert(AlertKind.RUN_MISSING.value, "tf-bert-squad-v100", "tf-bert-squad-v100-008", "", 0.0)


def command(workdir, input_file, grouping):
    return [sys.executable, "-m", "pipeline", f"--input_files={input_file}", f"--config_dir={REPO}/configs",
            f"--local_store={workdir}/store.duckdb", f"--alerts_file={workdir}/alerts.jsonl", "--report_dir=",
            "--no_progress", grouping]


# The zygote's loop: a request is a JSON line (argv, environment, stderr file); the reply, the child's exit status.
ZYGOTE_LOOP = """
import json, os, sys, traceback
import pipeline.__main__ as entry
for line in sys.stdin:
    request = json.loads(line)
    child = os.fork()
    if child == 0:
        try:
            os.environ.clear()
            os.environ.update(request["env"])
            stderr = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            null = os.open(os.devnull, os.O_RDWR)
            for target, source in ((0, null), (1, null), (2, stderr)):
                os.dup2(source, target)
            entry.exit_now(entry.main(request["argv"]))
        except BaseException:
            traceback.print_exc()
        os._exit(70)
    _, status = os.waitpid(child, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


class Zygote:
    """A Python that has imported ``python -m pipeline`` and runs its ``main`` in a forked child per request.

    It is started fresh, with no thread of ours, so forking it is as safe as ``multiprocessing``'s fork
    server."""

    def __init__(self):
        self.process = subprocess.Popen([sys.executable, "-c", ZYGOTE_LOOP], cwd=REPO, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)

    def run(self, argv, stderr_file, env, timeout=300.0) -> subprocess.CompletedProcess:
        """``python -m pipeline argv`` with ``env``, as a child of the zygote: its exit status and stderr."""
        self.process.stdin.write(json.dumps({"argv": argv, "env": env, "stderr": stderr_file}) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        assert ready, f"no exit status from the zygote's child within {timeout} s"
        status = int(self.process.stdout.readline())
        with open(stderr_file, encoding="utf-8") as f:
            return subprocess.CompletedProcess(argv, status, "", f.read())

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=60)


@pytest.fixture(scope="module")
def zygote():
    started = Zygote()
    yield started
    started.close()


def run(zygote, workdir, input_file, grouping, **env):
    return zygote.run(command(workdir, input_file, grouping)[3:], f"{workdir}.stderr.txt",
                      {**os.environ, **env})


def in_this_process(workdir, input_file, grouping):
    """``command`` run by its ``main`` in this process: its exit status and stderr."""
    from pipeline.main import main
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        status = main(command(workdir, input_file, grouping)[3:])
    return status, stderr.getvalue()


def outputs(workdir):
    alerts = os.path.join(workdir, "alerts.jsonl")
    with open(alerts, "rb") as f:
        return table_contents(os.path.join(workdir, "store.duckdb")), f.read()


class Scenario:
    """An earlier invocation's outputs (``before``), the next invocation's input, and a clean run of it."""

    def __init__(self, root, grouping, zygote):
        runs = cifar_lines()
        self.root, self.grouping = root, grouping
        self.first = messy_input(pathlib.Path(root), "early", runs[:8])
        self.second = messy_input(pathlib.Path(root), "first", runs[8:])  # "first": the demo's lines too
        with open(self.second, "ab") as f:  # an alert announced again, dismissed: a second line in the alerts file
            f.write(wire.encode_triage(MISSING_BERT.test, wire.Triage(
                "dismiss", T0 + 9 * 86400, metric=None, run=MISSING_BERT.run, alert_id=MISSING_BERT.alert_id,
                alert_kind=MISSING_BERT.kind), "dismiss-missing-bert") + b"\n")
        self.before = self.fresh(f"before{grouping}")
        # in this process (nothing is killed or traced in it): a child's start-up, mostly importing Beam, saved
        assert in_this_process(self.before, self.first, grouping)[0] == 0
        clean = self.fresh(f"clean{grouping}")
        trace = os.path.join(clean, "instants.txt")
        assert run(zygote, clean, self.second, grouping, **{CRASH_TRACE_ENV: trace}).returncode == 0
        self.clean = outputs(clean)
        assert self.clean[1].count(MISSING_BERT.alert_id.encode()) == 2 and b'dismissed' in self.clean[1]
        with open(trace, encoding="utf-8") as f:
            self.instants = f.read().split()

    def fresh(self, name):
        """A work directory holding a copy of the earlier invocation's outputs (none for the first)."""
        workdir = os.path.join(self.root, name)
        if hasattr(self, "before"):
            shutil.copytree(self.before, workdir)
        else:
            os.makedirs(workdir)
        return workdir

    def assert_rerun_is_clean(self, workdir) -> str:
        """Runs the same command again (in this process: it is not killed) and compares; returns its stderr."""
        status, stderr = in_this_process(workdir, self.second, self.grouping)
        assert status == 0, stderr
        assert outputs(workdir) == self.clean
        assert not [n for n in os.listdir(workdir) if n.startswith(".trainguard-staging-")]
        return stderr


@pytest.fixture(scope="module")
def one_group(tmp_path_factory, zygote):
    return Scenario(str(tmp_path_factory.mktemp("kills")), ONE_GROUP, zygote)


@pytest.fixture(scope="module")
def in_groups(tmp_path_factory, zygote):
    return Scenario(str(tmp_path_factory.mktemp("kills")), TINY_GROUPS, zygote)


def test_a_clean_run_passes_every_instant_a_kill_is_tried_at(one_group, in_groups):
    assert one_group.instants == ["commit.begin#1", "commit.job_history#1", "commit.metric_history#1",
                                  "commit.alerts#1", "commit.dead_letter#1", "commit.metric_windows#1",
                                  "commit.triage#1", "commit.rank_metrics#1", "commit.alert_lines#1",
                                  "commit.done#1", "alerts_file.write#1", "alerts_file.done#1"]
    assert in_groups.instants.count("commit.done#1") == 1 and "replay.between_groups#4" in in_groups.instants


def kill_and_rerun(zygote, scenario, instant):
    workdir = scenario.fresh(f"killed-{instant}".replace("#", "-"))
    killed = run(zygote, workdir, scenario.second, scenario.grouping, **{CRASH_AT_ENV: instant})
    assert killed.returncode == -signal.SIGKILL, (instant, killed.stderr[-2000:])
    return scenario.assert_rerun_is_clean(workdir)


ONE_GROUP_INSTANTS = ["commit.begin", "commit.job_history", "commit.metric_history", "commit.alerts",
                      "commit.dead_letter", "commit.metric_windows", "commit.triage", "commit.rank_metrics",
                      "commit.alert_lines", "commit.done", "alerts_file.write", "alerts_file.done"]


@pytest.mark.parametrize("instant", ONE_GROUP_INSTANTS)
def test_a_kill_at_any_instant_of_the_commit_then_a_rerun_equals_a_clean_run(zygote, one_group, instant):
    rerun = kill_and_rerun(zygote, one_group, instant)
    if instant == "alerts_file.write":  # killed half way through a line
        assert "ended in a torn line" in rerun


@pytest.mark.parametrize("instant", ["replay.between_groups#1", "commit.metric_history#3", "commit.done#4",
                                     "alerts_file.write"])
def test_a_kill_between_or_inside_groups_then_a_rerun_equals_a_clean_run(zygote, in_groups, instant):
    assert instant in in_groups.instants or f"{instant}#1" in in_groups.instants
    kill_and_rerun(zygote, in_groups, instant)


@pytest.mark.parametrize("delay", [3.0])
def test_a_kill_at_a_moment_in_the_pipeline_then_a_rerun_equals_a_clean_run(one_group, delay):
    workdir = one_group.fresh(f"killed-after-{delay}")
    process = subprocess.Popen(command(workdir, one_group.second, ONE_GROUP), cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(delay)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    one_group.assert_rerun_is_clean(workdir)


def in_process(tmp_path, *options):
    """``python -m pipeline`` on the demo, in this process: its exit status."""
    from pipeline.main import main
    return main([f"--input_files={REPO}/data/demo/*.jsonl", f"--config_dir={REPO}/configs", "--report_dir=",
                 *options])


@pytest.mark.parametrize("store, alerts, message", [
    ("store.duckdb", "out", "--alerts_file={tmp}/out is a directory, not a file"),
    ("out", "alerts.jsonl", "--local_store={tmp}/out is a directory, not a DuckDB file"),
    ("notes.txt", "alerts.jsonl", "--local_store={tmp}/notes.txt is not a DuckDB file (12 bytes that DuckDB did "
                                  "not write); name another file, or move this one away"),
])
def test_unusable_outputs_stop_the_replay_before_any_work_with_one_line(tmp_path, capsys, store, alerts, message):
    (tmp_path / "out").mkdir()
    (tmp_path / "notes.txt").write_text("not a store\n")
    status = in_process(tmp_path, f"--local_store={tmp_path / store}", f"--alerts_file={tmp_path / alerts}")
    err = capsys.readouterr().err
    assert status == 2 and err == f"trainguard: error: {message.format(tmp=tmp_path)}\n"
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "out"] and not os.listdir(tmp_path / "out")


def test_a_second_replay_into_a_store_being_written_stops_naming_the_holder(tmp_path, capsys):
    from sinks.store_lock import StoreLock
    with StoreLock(str(tmp_path / "store.duckdb")):
        status = in_process(tmp_path, f"--local_store={tmp_path / 'store.duckdb'}",
                            f"--alerts_file={tmp_path / 'alerts.jsonl'}")
    err = capsys.readouterr().err
    assert status == 2 and f"is being written by pid {os.getpid()}" in err and err.count("\n") == 1


def test_an_alerts_file_with_a_torn_last_line_is_repaired_from_the_store_and_said(tmp_path, capsys):
    outputs = (f"--local_store={tmp_path / 'store.duckdb'}", f"--alerts_file={tmp_path / 'alerts.jsonl'}")
    assert in_process(tmp_path, *outputs) == 0
    alerts = tmp_path / "alerts.jsonl"
    clean = alerts.read_bytes()
    last = clean.rindex(b"\n", 0, len(clean) - 1) + 1
    alerts.write_bytes(clean[:last + 40])  # the last line torn 40 bytes in, as a kill while appending leaves it
    capsys.readouterr()
    assert in_process(tmp_path, *outputs) == 0
    assert alerts.read_bytes() == clean
    assert "ended in a torn line (40 bytes" in capsys.readouterr().err
