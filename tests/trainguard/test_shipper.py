"""The TensorBoard shipper, on event files written by tensorboard's writers."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from tests.trainguard.support import ROOT, events_of, jsonl_payloads, parse_all, points_of
from tests.trainguard.tb_files import T0, TF1Writer, TF2Writer, event_files, native_scalars
from trainguard.shipper import Shipper, ShipperConfig, main
from trainguard.tb_events import RecordTail, first_wall_time
from trainguard.transports import JsonlTransport


def make_shipper(logdir, output, **kwargs):
    config = ShipperConfig(logdir=str(logdir), test=kwargs.pop("test", "tb-test"), run=kwargs.pop("run", "r1"),
                           **kwargs)
    return Shipper(config, JsonlTransport(str(output)))


def shipped(output):
    return parse_all(jsonl_payloads(str(output)))


def triples(output):
    return [(p.tag, p.value, p.step) for p in points_of(shipped(output))]


def test_scalars_of_every_encoding_with_run_prefixes(tmp_path):
    logdir = tmp_path / "logs"
    tf1 = TF1Writer(str(logdir / "train"))
    for step in range(5):
        tf1.scalar("loss", 1.0 / (step + 1), step)
    tf1.close()
    tf2 = TF2Writer(str(logdir / "eval"))
    for step in range(3):
        tf2.scalar("acc", 0.5 + step / 10, step * 10)
        tf2.text("notes", f"step {step}", step)
    tf2.close()
    native_scalars(str(logdir), [("lr", 0.1, 0), ("lr", 0.05, 1)])

    output = tmp_path / "out.jsonl"
    shipper = make_shipper(logdir, output)
    shipper.poll()
    got = sorted(triples(output))
    want = sorted([("train/loss", float(str(__import__("numpy").float32(1.0 / (s + 1)))), s) for s in range(5)]
                  + [("eval/acc", 0.5 + s / 10, s * 10) for s in range(3)]
                  + [("lr", 0.1, 0), ("lr", 0.05, 1)])
    assert got == want
    times = {(p.tag, p.step): p.time for p in points_of(shipped(output))}
    assert times[("eval/acc", 20)] == T0 + 20 and times[("lr", 1)] == T0 + 1
    messages = shipped(output)
    assert {(m.test, m.run) for m in messages} == {("tb-test", "r1")}


def test_float32_values_keep_their_short_form(tmp_path):
    native_scalars(str(tmp_path / "logs"), [("x", 0.1, 0), ("y", 1e-7, 0)])
    output = tmp_path / "out.jsonl"
    make_shipper(tmp_path / "logs", output).poll()
    assert sorted(triples(output)) == [("x", 0.1, 0), ("y", 1e-7, 0)]
    assert b'"value":0.1,' in jsonl_payloads(str(output))[0]


def test_ignored_tags(tmp_path):
    logdir = tmp_path / "logs"
    for run in ("train", "eval"):
        writer = TF1Writer(str(logdir / run))
        for tag in ("loss", "lr", "debug/grad_norm"):
            writer.scalar(tag, 1.0, 1)
        writer.close()
    output = tmp_path / "out.jsonl"
    make_shipper(logdir, output, ignore_tags=["*/lr", "train/debug/*"]).poll()
    assert sorted(t for t, _, _ in triples(output)) == ["eval/debug/grad_norm", "eval/loss", "train/loss"]


def test_growing_and_new_files_are_tailed(tmp_path):
    logdir = tmp_path / "logs"
    output = tmp_path / "out.jsonl"
    shipper = make_shipper(logdir, output)
    shipper.poll()  # nothing yet, not even the directory
    writer = TF1Writer(str(logdir / "train"))
    for step in range(3):
        writer.scalar("loss", float(step), step)
    writer.flush()
    shipper.poll()
    assert [s for _, _, s in triples(output)] == [0, 1, 2]
    for step in range(3, 7):
        writer.scalar("loss", float(step), step)
    writer.flush()
    second = TF2Writer(str(logdir / "eval"))
    second.scalar("acc", 0.9, 6)
    second.flush()
    shipper.poll()
    assert sorted(triples(output)) == sorted([("train/loss", float(s), s) for s in range(7)] + [("eval/acc", 0.9, 6)])
    writer.close()
    second.close()


def test_a_record_being_written_is_picked_up_once_complete(tmp_path):
    source = tmp_path / "source"
    writer = TF1Writer(str(source))
    for step in range(4):
        writer.scalar("loss", float(step), step)
    writer.close()
    data = pathlib.Path(writer.path).read_bytes()
    ends = [end for _, end in RecordTail(writer.path).read(0, 100)]
    logdir = tmp_path / "logs"
    logdir.mkdir()
    target = logdir / os.path.basename(writer.path)
    output = tmp_path / "out.jsonl"
    shipper = make_shipper(logdir, output)
    cut = ends[2] + 7  # two scalar records, then 7 bytes of the third (mid-header)
    target.write_bytes(data[:cut])
    shipper.poll()
    assert [s for _, _, s in triples(output)] == [0, 1]
    with open(target, "ab") as f:
        f.write(data[cut:ends[3] - 3])  # all but the third record's trailing CRC
    shipper.poll()
    assert [s for _, _, s in triples(output)] == [0, 1]
    with open(target, "ab") as f:
        f.write(data[ends[3] - 3:])
    shipper.poll()
    assert [s for _, _, s in triples(output)] == [0, 1, 2, 3]


def test_restart_resumes_without_resending_or_losing(tmp_path):
    logdir = tmp_path / "logs"
    output = tmp_path / "out.jsonl"
    writer = TF2Writer(str(logdir / "train"))
    for step in range(50):
        writer.scalar("loss", float(step), step)
    writer.flush()
    first = make_shipper(logdir, output, max_records_per_read=7)
    first.ensure_started()
    first.poll()
    first.transport.close()
    for step in range(50, 80):  # TF2: no metadata on these values; the restarted shipper must remember the tag
        writer.scalar("loss", float(step), step)
    writer.close()
    second = make_shipper(logdir, output)
    second.ensure_started()  # already sent: not again
    second.poll()
    second.poll()
    second.transport.close()
    assert [s for _, _, s in triples(output)] == list(range(80))
    assert [e.type for e in events_of(shipped(output))] == ["run_started"]
    state = json.loads((logdir / ".trainguard-ship.tb-test.r1.json").read_text())
    assert state["kinds"] == {"train": {"loss": "scalar"}}
    [(path, entry)] = state["files"].items()
    assert entry["offset"] == os.path.getsize(logdir / path)


def test_message_ids_are_deterministic_so_a_resent_chunk_is_recognisable(tmp_path):
    logdir = tmp_path / "logs"
    writer = TF1Writer(str(logdir))
    for step in range(30):
        writer.scalar("loss", float(step), step)
    writer.close()
    ids = []
    for attempt in ("a", "b"):
        output = tmp_path / f"{attempt}.jsonl"
        shipper = make_shipper(logdir, output, state_path=str(tmp_path / f"{attempt}.state"),
                               max_points_per_message=8)
        shipper.ensure_started()
        shipper.poll()
        ids.append([m.id for m in shipped(output)])
    assert ids[0] == ids[1] and len(set(ids[0])) == len(ids[0]) == 1 + 4


def test_finish_on_idle_sends_run_finished_at_the_last_data_time(tmp_path):
    logdir = tmp_path / "logs"
    writer = TF1Writer(str(logdir))
    writer.scalar("loss", 1.0, 5, wall_time=T0 + 5)
    writer.close()
    output = tmp_path / "out.jsonl"
    shipper = make_shipper(logdir, output, poll_interval_s=0.02, finish_on_idle_s=0.2, idle_status="timeout")
    assert shipper.run() == 0
    events = events_of(shipped(output))
    assert [e.type for e in events] == ["run_started", "run_finished"]
    [path] = event_files(str(logdir))
    assert events[0].time == int(first_wall_time(path) * 1000) / 1000  # when its first event file began
    assert events[1].time == T0 + 5 and events[1].data["status"] == "timeout"
    assert events[1].data["reason"] == "idle"
    again = make_shipper(logdir, output, poll_interval_s=0.02, finish_on_idle_s=0.2)
    assert again.run() == 0  # a finished run is not finished twice
    assert len(events_of(shipped(output))) == 2


TRAIN_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    import os
    from tests.trainguard.tb_files import TF1Writer
    assert os.environ["TRAINGUARD_TEST"] == "wrapped" and os.environ["TRAINGUARD_RUN"] == "w1"
    writer = TF1Writer(sys.argv[1] + "/train")
    for step in range(20):
        writer.scalar("loss", float(step), step)
        writer.flush()
    writer.close()
    sys.exit(int(sys.argv[2]))
""")


@pytest.mark.parametrize("exit_code, status", [(0, "success"), (3, "failure")])
def test_wrapped_command_exit_status_becomes_run_finished(tmp_path, exit_code, status):
    logdir = tmp_path / "logs"
    output = tmp_path / "out.jsonl"
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT.format(root=ROOT))
    env = dict(os.environ, PYTHONPATH=ROOT)
    result = subprocess.run(
        [sys.executable, "-m", "trainguard.shipper", "--logdir", str(logdir), "--test", "wrapped", "--run", "w1",
         "--output", str(output), "--poll-interval", "0.05", "-q", "--",
         sys.executable, str(script), str(logdir), str(exit_code)],
        env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == exit_code, result.stderr
    assert [s for _, _, s in triples(output)] == list(range(20))
    events = events_of(shipped(output))
    assert [e.type for e in events] == ["run_started", "run_finished"]
    assert events[1].data["status"] == status and events[1].data["exit_code"] == exit_code
    assert "train.py" in events[0].data["command"]


def test_command_line_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--logdir", str(tmp_path), "--test", "t", "--run", "r"])  # neither --topic nor --output
    with pytest.raises(SystemExit):
        main(["--logdir", str(tmp_path), "--test", "t", "--run", "r", "--topic", "not-a-topic"])
    with pytest.raises(SystemExit):
        main(["--logdir", str(tmp_path), "--test", "t", "--run", "r", "--output", str(tmp_path / "o"),
              "--finish-on-idle", "5", "--", "true"])
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"test": "other", "run": "r"}))
    with pytest.raises(SystemExit):
        main(["--logdir", str(tmp_path), "--test", "t", "--run", "r", "--output", str(tmp_path / "o"),
              "--state", str(state)])
    assert "belongs to test='other'" in capsys.readouterr().err


def test_corrupt_file_is_reported_and_skipped(tmp_path, caplog):
    logdir = tmp_path / "logs"
    writer = TF1Writer(str(logdir))
    for step in range(3):
        writer.scalar("loss", float(step), step)
    writer.close()
    [path] = event_files(str(logdir))
    ends = [end for _, end in RecordTail(path).read(0, 100)]
    data = bytearray(pathlib.Path(path).read_bytes())
    data[ends[1] + 2] ^= 0xFF  # break the length header of the second scalar record
    pathlib.Path(path).write_bytes(bytes(data))
    output = tmp_path / "out.jsonl"
    shipper = make_shipper(logdir, output)
    shipper.poll()
    shipper.poll()
    assert triples(output) == [("loss", 0.0, 0)]
    assert "bad length CRC" in caplog.text


def ship_cli(logdir, output, *options):
    """``trainguard-ship`` in-process, finishing as soon as the log directory is idle."""
    return main(["--logdir", str(logdir), "--test", "ddp", "--run", "d1", "--output", str(output), "-q",
                 "--finish-on-idle", "0.1", "--poll-interval", "0.02", *options])


def by_rank(messages):
    """{rank: (sorted point tags, event types)}."""
    ranks = {}
    for message in messages:
        tags, types = ranks.setdefault(message.rank, (set(), []))
        tags.update(p[0] for p in message.points)
        types.extend(e.type for e in message.events)
    return {rank: (sorted(tags), types) for rank, (tags, types) in ranks.items()}


def test_the_rank_flag_goes_on_every_message(tmp_path):
    logdir = tmp_path / "logs"
    writer = TF1Writer(str(logdir / "train"))
    for step in range(5):
        writer.scalar("loss", float(step), step)
    writer.close()
    output = tmp_path / "out.jsonl"
    assert ship_cli(logdir, output, "--rank", "1", "--world-size", "2") == 0
    messages = shipped(output)
    assert {(m.rank, m.world_size) for m in messages} == {(1, 2)}
    assert [s for _, _, s in triples(output)] == list(range(5))
    started, finished = events_of(messages)
    assert started.data["rank"] == 1 and finished.data["status"] == "success"


def test_rank_directories_ship_their_files_with_their_rank_and_without_a_tag_prefix(tmp_path):
    logdir = tmp_path / "logs"
    for directory, tag, writer_class in (("rank0/train", "loss", TF1Writer), ("rank_1", "loss", TF2Writer),
                                         ("rank-2/eval", "acc", TF1Writer), ("summary", "throughput", TF1Writer)):
        writer = writer_class(str(logdir / directory))
        for step in range(3):
            writer.scalar(tag, float(step), step)
        writer.close()
    output = tmp_path / "out.jsonl"
    assert ship_cli(logdir, output, "--rank", "3", "--world-size", "4") == 0
    messages = shipped(output)
    assert {m.world_size for m in messages} == {4}
    assert len({m.id for m in messages}) == len(messages)  # each rank's run events are its own messages
    assert by_rank(messages) == {
        0: (["train/loss"], ["run_started", "run_finished"]),
        1: (["loss"], ["run_started", "run_finished"]),
        2: (["eval/acc"], ["run_started", "run_finished"]),
        3: (["summary/throughput"], ["run_started", "run_finished"]),  # the flag's rank: outside rank dirs
    }
    starts = {m.rank: e for m in messages for e in m.events if e.type == "run_started"}
    assert {rank: e.data["rank"] for rank, e in starts.items()} == {0: 0, 1: 1, 2: 2, 3: 3}


def test_rank_directories_without_the_flag_leave_other_files_and_run_events_rankless(tmp_path):
    logdir = tmp_path / "logs"
    writer = TF1Writer(str(logdir / "rank_1"))
    writer.scalar("loss", 1.0, 1)
    writer.close()
    output = tmp_path / "out.jsonl"
    assert ship_cli(logdir, output) == 0
    assert by_rank(shipped(output)) == {None: ([], ["run_started", "run_finished"]),
                                        1: (["loss"], ["run_started", "run_finished"])}


def test_a_restarted_shipper_starts_new_ranks_and_no_rank_twice(tmp_path):
    logdir = tmp_path / "logs"
    writer = TF1Writer(str(logdir / "rank0"))
    writer.scalar("loss", 1.0, 1)
    writer.flush()
    output = tmp_path / "out.jsonl"
    first = make_shipper(logdir, output, rank=0, world_size=2)
    first.ensure_started()
    first.poll()
    writer.scalar("loss", 2.0, 2)
    writer.close()
    TF1Writer(str(logdir / "rank1")).close()  # a rank that has written nothing but its file header yet
    second = make_shipper(logdir, output, rank=0, world_size=2)
    second.ensure_started()
    second.poll()
    second.finish("success", T0 + 10)
    assert by_rank(shipped(output)) == {0: (["loss"], ["run_started", "run_finished"]),
                                        1: ([], ["run_started", "run_finished"])}
    assert [s for _, _, s in triples(output)] == [1, 2]


def test_a_rank_directory_outside_the_world_size_is_an_ordinary_directory(tmp_path, caplog):
    logdir = tmp_path / "logs"
    writer = TF1Writer(str(logdir / "rank7"))
    writer.scalar("loss", 1.0, 1)
    writer.close()
    output = tmp_path / "out.jsonl"
    make_shipper(logdir, output, rank=0, world_size=4).poll()
    assert [(m.rank, [p[0] for p in m.points]) for m in shipped(output)] == [(0, ["rank7/loss"])]
    assert "rank7 is not read as a rank directory" in caplog.text


@pytest.mark.parametrize("options, error", [
    (["--ranks", "3"], "unknown option --ranks (did you mean --rank?)"),
    (["--rank", "two"], "argument --rank: invalid int value: 'two'"),
    (["--rank", "4", "--world-size", "4"], "rank 4 is not below world_size 4"),
    (["--rank", "1", "--world-size", "0"], "world_size must be an integer from 1"),
    (["--rank", "-1"], "rank must be an integer from 0"),
])
def test_bad_rank_options_exit_2_naming_the_problem(tmp_path, capsys, options, error):
    with pytest.raises(SystemExit) as exit_info:
        ship_cli(tmp_path, tmp_path / "out.jsonl", *options)
    assert exit_info.value.code == 2
    assert error in capsys.readouterr().err


def test_the_documented_distributed_shipper_command_ships_every_rank(tmp_path):
    with open(os.path.join(ROOT, "docs", "trainer.md"), encoding="utf-8") as f:
        docs = f.read()
    start = docs.index("trainguard-ship --logdir runs/ --test bert-ddp")
    command = docs[start:docs.index("\n```", start)]
    for rank in range(4):
        writer = TF1Writer(str(tmp_path / "runs" / f"rank{rank}" / "train"))
        writer.scalar("loss", float(rank), 1)
        writer.close()
    env = dict(os.environ, PYTHONPATH=ROOT, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    # As documented, but not waiting 600 s for the log directory to go idle.
    result = subprocess.run(["bash", "-c", f"{command} --finish-on-idle 0.2 --poll-interval 0.05 -q"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    messages = shipped(tmp_path / "metrics.jsonl")
    assert {m.world_size for m in messages if m.rank is not None} == {4}
    assert by_rank(messages) == {None: ([], ["run_started", "run_finished"]),
                                 **{rank: (["train/loss"], ["run_started", "run_finished"]) for rank in range(4)}}


def test_a_missing_log_directory_fails_in_one_line_and_is_not_created(tmp_path, capsys):
    missing = tmp_path / "nonexistent"
    assert main(["--logdir", str(missing), "--test", "t", "--run", "r", "--output", str(tmp_path / "o.jsonl"),
                 "--finish-on-idle", "2"]) == 2
    assert f"no log directory '{missing}'" in capsys.readouterr().err
    assert not missing.exists() and not (tmp_path / "o.jsonl").exists()


def test_a_run_without_a_single_point_is_never_reported_a_success(tmp_path, caplog):
    logdir = tmp_path / "logs"
    logdir.mkdir()
    output = tmp_path / "out.jsonl"
    assert ship_cli(logdir, output) == 1
    finished = events_of(shipped(output))[-1]
    assert finished.type == "run_finished" and finished.data["status"] == "failure"
    assert finished.data["reason"] == "no_data"
    assert "no scalar point found" in caplog.text


def test_a_wrapped_command_that_succeeds_without_writing_a_point_is_not_a_success(tmp_path):
    logdir, output = tmp_path / "logs", tmp_path / "out.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "trainguard.shipper", "--logdir", str(logdir), "--test", "t", "--run", "r",
         "--output", str(output), "--poll_interval", "0.05", "-q", "--", sys.executable, "-c", "pass"],
        env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "no scalar point found" in result.stderr
    assert events_of(shipped(output))[-1].data["status"] == "failure"


def test_underscore_and_dashed_spellings_of_an_option_are_the_same(tmp_path):
    writer = TF1Writer(str(tmp_path / "logs"))
    writer.scalar("loss", 1.0, 1)
    writer.close()
    for spelling in ("--finish_on_idle", "--finish-on-idle"):
        output = tmp_path / f"{spelling}.jsonl"
        assert main(["--logdir", str(tmp_path / "logs"), "--test", "t", "--run", spelling.strip("-"), "--output",
                     str(output), "-q", spelling, "0.1", "--poll_interval", "0.02"]) == 0
        assert events_of(shipped(output))[-1].data["status"] == "success"
