"""The documented commands run: every command block of the README and docs/ is run by a test, as written.

Each ```sh and ```python block carries a mark on the line before its fence, saying how it is run:

- ``<!-- runnable: tests/test_docs.py runs this block -->``: as written.
- ``<!-- dry-run: tests/test_docs.py runs this block in its dry-run form against the local fakes -->``: a block
  that needs the cloud. Pub/Sub is the in-process server (``PUBSUB_EMULATOR_HOST``; every topic and
  subscription the block names is created first), BigQuery is the emulator (``--bigquery_endpoint`` is added
  where a command names ``--bigquery_project``, whose value becomes the emulator's project, and the dataset
  holds the demo's rows), ``gs://`` is a local
  directory, a deploy script (``*.sh``) gets ``--dry_run``, ``pip install`` gets pip's ``--dry-run`` (offline,
  without dependencies, the extras it names checked against the project's), ``--finish_on_idle`` waits one
  second, and a long-running command is stopped with Ctrl-C once it says ``Ctrl-C stops it``; it must then
  exit 0. A Python block that names a topic must publish to it.
- ``<!-- tested: tests/<file>.py runs this block -->``: another test runs it (with more checks); that file must
  name the block's section heading (or the document, for a block before any heading).

A ```text block may be marked ``<!-- output: tests/test_docs.py compares this block with the output of the
block above -->``: the block above runs in a fresh directory and prints these lines, numbers of seconds aside.
Every ```json block is checked: a wire message (``"schema"``) is parsed by the wire contract, a config
fragment is merged into a demo config and loaded as strictly as ``configs/`` is.

Commands run with bash, one per line (continuations joined), in a scratch copy of the checkout (its top-level
files and directories linked, ``.venv`` linking this Python's environment) after the demo replay has written
``trainguard.duckdb`` and ``alerts.jsonl``, with this Python's console scripts first on the PATH. The scratch
also has what the trainer docs take as given: ``runs/`` (TensorBoard logs), ``train.py`` (writes more) and
``email.json`` (the example e-mail config). Python blocks run after ``PYTHON_PRELUDE``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import List, Optional

import pytest

from pipeline.main import main as pipeline_main
from tests.support import REPO_ROOT, run_shell_line

DOCS = [os.path.join(REPO_ROOT, "README.md"), *sorted(glob.glob(os.path.join(REPO_ROOT, "docs", "*.md")))]
LANGUAGES = {"sh", "python", "json", "text", "mermaid", "ini"}
COMMAND_LANGUAGES = {"sh", "python"}
MARK = re.compile(r"^<!-- (runnable|dry-run|tested|output): (.+) -->$")
MARK_TEXT = {
    "runnable": "tests/test_docs.py runs this block",
    "dry-run": "tests/test_docs.py runs this block in its dry-run form against the local fakes",
    "output": "tests/test_docs.py compares this block with the output of the block above",
}
FENCE = re.compile(r"^( *)```(\S*)\s*$")
NOT_IN_SCRATCH = {".git", ".venv", "alerts.jsonl", "trainguard.triage.jsonl", "triage.jsonl",
                  "trainguard-report", "email-dry-run", "email-state.sqlite", "metrics.jsonl", "runs", "train.py", "email.json"}
STORE_FILES = "trainguard.duckdb"  # the store and what DuckDB and the store lock keep beside it (.wal, .lock)
RUNNING = "Ctrl-C stops it"
PUBSUB_NAME = re.compile(r"projects/[\w.-]+/(?:topics|subscriptions)/[\w.~%+-]+")
COMMAND_TIMEOUT_S = 300
README_SET_UP = "awk '/^```sh$/ {inside = 1; next} inside && /^```$/ {exit} inside' README.md"

PYTHON_PRELUDE = '''
import trainguard as tg

class _Loss(float):
    def item(self):
        return float(self)

class _Scheduler:
    def get_last_lr(self):
        return [0.1]

class _ProcessGroup:
    def get_rank(self):
        return 0
    def get_world_size(self):
        return 2

loader = [[0.5, 0.25], [0.25, 0.125], [0.125, 0.0625]]          # three batches
train_step = lambda batch: _Loss(sum(batch))                    # noqa: E731
scheduler = _Scheduler()
step_times_ms = [12.5, 13.0, 12.75, 14.0] * 50
topic = "projects/my-proj/topics/trainguard"
dist = _ProcessGroup()
'''

TRAIN_PY = '''
"""A stand-in for a training script: writes a loss curve to runs/ as TensorBoard scalars."""
import argparse
from tensorboard.summary import Writer

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()
writer = Writer("runs/train")
for step in range(10 * args.epochs):
    writer.add_scalar("loss", 2.0 / (step + 1), step)
writer.close()
'''


@dataclasses.dataclass(frozen=True)
class DocBlock:
    """A fenced block of a document, with its mark and the section it is in."""
    path: str  # relative to the checkout
    line: int  # of the opening fence, 1-based
    language: str
    mark: Optional[str]  # runnable, dry-run, tested, output, or None
    mark_text: str
    heading: str  # the nearest heading above ("" before the first)
    text: str  # the block's lines, de-indented

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    def commands(self) -> List[str]:
        """The commands of a shell block: continuation lines joined, blank lines left out."""
        commands, current = [], ""
        for line in self.text.splitlines():
            continued = line.rstrip().endswith("\\")
            current += line.rstrip().rstrip("\\").rstrip() + " " if continued else line
            if not continued:
                if current.strip():
                    commands.append(current.strip())
                current = ""
        return commands


def blocks_of(path: str) -> List[DocBlock]:
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    blocks, heading, last_text, number = [], "", "", 0
    while number < len(lines):
        line = lines[number]
        fence = FENCE.match(line)
        if not fence:
            if line.startswith("#"):
                heading = line.strip()
            if line.strip():
                last_text = line.strip()
            number += 1
            continue
        indent, language = fence.groups()
        end = next(i for i in range(number + 1, len(lines)) if lines[i].strip() == "```")
        mark = MARK.match(last_text)
        blocks.append(DocBlock(os.path.relpath(path, REPO_ROOT), number + 1, language,
                               mark.group(1) if mark else None, mark.group(2) if mark else "", heading,
                               textwrap.dedent("\n".join(lines[number + 1:end])) + "\n"))
        last_text, number = "```", end + 1
    return blocks


ALL_BLOCKS = [block for path in DOCS for block in blocks_of(path)]


def marked(kind: str) -> list:
    return [pytest.param(b, id=b.id) for b in ALL_BLOCKS if b.mark == kind]


def test_every_command_block_of_the_docs_is_run_by_a_test():
    problems = []
    for block in ALL_BLOCKS[1:]:  # the README's set-up block is .ci/run's
        if block.language not in LANGUAGES:
            problems.append(f"{block.id}: a ```{block.language or ''} block: say what it is ({sorted(LANGUAGES)})")
        elif block.language in COMMAND_LANGUAGES and block.mark not in ("runnable", "dry-run", "tested"):
            problems.append(f"{block.id}: a ```{block.language} block without a runnable, dry-run or tested mark")
        elif block.mark == "output" and block.language != "text":
            problems.append(f"{block.id}: an output mark on a ```{block.language} block")
        elif block.mark in MARK_TEXT and block.mark_text != MARK_TEXT[block.mark]:
            problems.append(f"{block.id}: the {block.mark} mark must read {MARK_TEXT[block.mark]!r}")
    assert not problems, "\n".join(problems)
    assert len(marked("runnable")) >= 5 and len(marked("dry-run")) >= 5


# -- the scratch checkout -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_replay(tmp_path_factory):
    where = tmp_path_factory.mktemp("demo")
    cwd = os.getcwd()
    try:
        os.chdir(where)
        assert pipeline_main(["--report_dir="]) == 0
    finally:
        os.chdir(cwd)
    return where


def checkout_view(where) -> None:
    """Links the checkout's top-level entries into ``where`` (``.venv``: this Python's environment), but none of
    a local store's files: a demo replay in the checkout (``.ci/run`` runs one first) leaves
    ``trainguard.duckdb.lock``, and linked, every scratch's replay took that one lock, so two blocks running at
    once in two workers stopped each other."""
    for name in os.listdir(REPO_ROOT):
        if name not in NOT_IN_SCRATCH and not name.startswith(STORE_FILES):
            os.symlink(os.path.join(REPO_ROOT, name), where / name)
    os.symlink(sys.prefix, where / ".venv")


@pytest.fixture
def scratch(demo_replay, tmp_path):
    import shutil

    from tests.trainguard.tb_files import native_scalars

    checkout_view(tmp_path)
    for name in ("trainguard.duckdb", "alerts.jsonl"):
        shutil.copy(demo_replay / name, tmp_path / name)
    native_scalars(str(tmp_path / "runs" / "train"), [("loss", 2.0 / (step + 1), step) for step in range(20)])
    (tmp_path / "train.py").write_text(TRAIN_PY)
    shutil.copy(os.path.join(REPO_ROOT, "notifier", "example-config.json"), tmp_path / "email.json")
    return tmp_path


def test_a_scratch_links_no_file_of_a_store_the_checkout_holds(tmp_path, monkeypatch):
    checkout, scratch = tmp_path / "checkout", tmp_path / "scratch"
    checkout.mkdir()
    scratch.mkdir()
    for name in ("README.md", "trainguard.duckdb", "trainguard.duckdb.lock", "trainguard.duckdb.wal", "alerts.jsonl"):
        (checkout / name).write_text("")
    monkeypatch.setattr(sys.modules[__name__], "REPO_ROOT", str(checkout))
    checkout_view(scratch)
    assert sorted(os.listdir(scratch)) == [".venv", "README.md"]


def run_python_block(block: DocBlock, cwd) -> subprocess.CompletedProcess:
    script = cwd / f"doc_block_{block.line}.py"
    script.write_text(PYTHON_PRELUDE + "\n" + block.text)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=cwd,
                          timeout=COMMAND_TIMEOUT_S)


def assert_ran(command: str, done) -> None:
    assert done.returncode == 0, f"{command!r} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("block", marked("runnable"))
def test_a_runnable_block_runs_as_written(block, scratch):
    if block.language == "python":
        assert_ran(block.text, run_python_block(block, scratch))
        return
    for command in block.commands():
        assert_ran(command, run_shell_line(command, str(scratch)))


# -- dry-run forms against the local fakes ---------------------------------------------------------------------


def demo_rows_into_bigquery(store_path: str, emulator, dataset: str) -> None:
    """The demo store's rows in an emulator dataset, every table created from the one schema module."""
    import duckdb
    from google.cloud import bigquery

    from core.schema import TABLES

    client = emulator.client()
    client.create_dataset(dataset, exists_ok=True)
    with duckdb.connect(store_path, read_only=True) as db:
        for table in TABLES.values():
            schema = [bigquery.SchemaField(c.name, c.type, mode="REQUIRED" if c.required else "NULLABLE")
                      for c in table.columns]
            client.create_table(bigquery.Table(f"{client.project}.{dataset}.{table.name}", schema=schema),
                                exists_ok=True)
            rows = [json.loads(row[0]) for row in db.execute(
                f"SELECT to_json(t) FROM {table.name} t").fetchall()]  # timestamps as ISO strings
            if rows:
                assert client.insert_rows_json(f"{client.project}.{dataset}.{table.name}", rows) == []


def pubsub_names(text: str) -> List[str]:
    return sorted(set(PUBSUB_NAME.findall(text)))


def create_pubsub_names(names: List[str]) -> None:
    """Every topic named, with a subscription to read it; every subscription named, on a topic of its name."""
    from google.cloud import pubsub_v1

    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    for name in names:
        _, project, kind, short = name.split("/")
        topic = f"projects/{project}/topics/{short}"
        if topic not in {t.name for t in publisher.list_topics(project=f"projects/{project}")}:
            publisher.create_topic(name=topic)
        subscription = name if kind == "subscriptions" else f"projects/{project}/subscriptions/{short}-docs-check"
        subscriber.create_subscription(name=subscription, topic=topic)
    subscriber.close()


def pip_dry_run(words: List[str], report: str) -> List[str]:
    """``pip install X`` as pip's own dry run: offline, no dependencies, a JSON report of what it resolved."""
    position = words.index("install") + 1
    return [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-index", "--no-build-isolation",
            "--quiet", "--report", report, *words[position:]]


def check_pip_report(report: str) -> None:
    with open(report, encoding="utf-8") as f:
        installs = json.load(f)["install"]
    assert installs, "pip resolved nothing"
    for install in installs:
        missing = set(install.get("requested_extras") or ()) - set(install["metadata"].get("provides_extra") or ())
        assert not missing, f"{install['metadata']['name']} has no extra {sorted(missing)}"


def dry_run_form(command: str, project: str, endpoint: str, gcs_dir: str, pip_report: str) -> List[str]:
    """The command as it runs against the fakes (see the module docstring), as bash words."""
    words = [word.replace("gs://", gcs_dir + "/") for word in shlex.split(command, comments=True)]
    program = next(i for i, word in enumerate(words) if not re.match(r"^[A-Z_]+=", word))
    if words[program] == "pip":
        return words[:program] + pip_dry_run(words[program:], pip_report)
    end = words.index("--") if "--" in words else len(words)
    options, rest = words[:end], words[end:]
    if options[program].endswith(".sh"):
        options.append("--dry_run")
    for i, word in enumerate(options):
        if word.startswith("--bigquery_project="):
            options[i] = f"--bigquery_project={project}"
            options.append(f"--bigquery_endpoint={endpoint}")
    for i, word in enumerate(options):
        if word == "--finish_on_idle":
            options[i + 1] = "1"
        elif word.startswith("--finish_on_idle="):
            options[i] = "--finish_on_idle=1"
    return options + rest


def run_until_ctrl_c(words: List[str], cwd) -> subprocess.CompletedProcess:
    """Runs a command; if it says it runs until Ctrl-C, sends Ctrl-C. Output of both streams, merged.

    A command still running ``COMMAND_TIMEOUT_S`` after it started, or 30 s after its Ctrl-C, is killed
    (with its process group) and fails with what it printed.
    """
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
               PYTHONUNBUFFERED="1")
    process = subprocess.Popen(["bash", "-c", shlex.join(words)], cwd=cwd, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    output, interrupted = [], threading.Event()

    def kill_after(seconds: float) -> threading.Timer:
        timer = threading.Timer(seconds, lambda: os.killpg(process.pid, signal.SIGKILL))
        timer.daemon = True
        timer.start()
        return timer

    watchdogs = [kill_after(COMMAND_TIMEOUT_S)]
    try:
        for line in process.stdout:
            output.append(line)
            if RUNNING in line and not interrupted.is_set():
                interrupted.set()
                time.sleep(1.0)  # let it reach its main loop
                os.killpg(process.pid, signal.SIGINT)
                watchdogs.append(kill_after(30))
        process.wait()
    finally:
        for watchdog in watchdogs:
            watchdog.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # nothing it started outlives the test
    return subprocess.CompletedProcess(words, process.returncode, "".join(output), "")


@pytest.mark.parametrize("block", marked("dry-run"))
def test_a_cloud_block_runs_in_its_dry_run_form_against_the_local_fakes(block, scratch, pubsub_server,
                                                                       bigquery_emulator):
    names = pubsub_names(block.text)
    create_pubsub_names(names)
    if "--bigquery_dataset" in block.text:
        dataset = re.search(r"--bigquery_dataset[= ](\w+)", block.text).group(1)
        demo_rows_into_bigquery(str(scratch / "trainguard.duckdb"), bigquery_emulator, dataset)
    if block.language == "python":
        assert_ran(block.text, run_python_block(block, scratch))
        for topic in (n for n in names if "/topics/" in n):
            assert pubsub_server.published_messages(topic), f"the example published nothing to {topic}"
        return
    for command in block.commands():
        pip_report = str(scratch / "pip-report.json")
        words = dry_run_form(command, bigquery_emulator.project, bigquery_emulator.endpoint, str(scratch / "gcs"), pip_report)
        assert_ran(shlex.join(words), run_until_ctrl_c(words, scratch))
        if "--report" in words:
            check_pip_report(pip_report)


def test_the_dry_run_form_is_what_the_docstring_says(tmp_path):
    form = dry_run_form("A=b notifier/deploy_cloud_run.sh   # --dry_run prints the commands", "p", "http://e", "/g", "r")
    assert form == ["A=b", "notifier/deploy_cloud_run.sh", "--dry_run"]
    form = dry_run_form("python -m report --bigquery_project=P --copy_to='gs://m/{test}'", "p", "http://e", "/g", "r")
    assert form == ["python", "-m", "report", "--bigquery_project=p", "--copy_to=/g/m/{test}",
                    "--bigquery_endpoint=http://e"]
    form = dry_run_form("trainguard-ship --finish_on_idle 600 --output m.jsonl -- python t.py", "p", "e", "g", "r")
    assert form == ["trainguard-ship", "--finish_on_idle", "1", "--output", "m.jsonl", "--", "python", "t.py"]
    assert dry_run_form("pip install './trainer[shipper]'", "p", "e", "g", "r")[-1] == "./trainer[shipper]"
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"install": [{"requested_extras": ["email", "nope"],
                                               "metadata": {"name": "x", "provides_extra": ["email"]}}]}))
    with pytest.raises(AssertionError, match="nope"):
        check_pip_report(str(report))


# -- blocks tested elsewhere, outputs, JSON ---------------------------------------------------------------------


@pytest.mark.parametrize("block", marked("tested"))
def test_a_block_tested_elsewhere_names_its_test(block):
    path = block.mark_text.split(" ", 1)[0]
    assert block.mark_text == f"{path} runs this block", f"{block.id}: the mark must read '<file> runs this block'"
    with open(os.path.join(REPO_ROOT, path), encoding="utf-8") as f:
        test = f.read()
    named = re.findall(r"\"(#+ [^\"]+)\"", test)  # readme_block("## Triage") names its section by a prefix
    assert any(block.heading.startswith(prefix) for prefix in named), f"{path} does not name {block.heading!r}"


def test_the_readme_set_up_commands_are_what_ci_runs():
    """The README's first block (no mark: it must be the README's first lines) runs, as written, in ``.ci/run``."""
    first = ALL_BLOCKS[0]
    assert (first.path, first.line, first.language) == ("README.md", 1, "sh") and len(first.commands()) == 2
    with open(os.path.join(REPO_ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read()
    assert README_SET_UP in ci


def mask_seconds(text: str) -> List[str]:
    return [re.sub(r"\d+(\.\d+)? s\b", "N s", line).rstrip() for line in text.strip().splitlines()]


@pytest.mark.parametrize("block", marked("output"))
def test_a_documented_output_is_what_the_command_prints(block, tmp_path):
    above = ALL_BLOCKS[ALL_BLOCKS.index(block) - 1]
    assert above.path == block.path and above.mark == "runnable", f"{block.id}: no runnable block above"
    checkout_view(tmp_path)
    printed = ""
    for command in above.commands():
        done = run_shell_line(command, str(tmp_path))
        assert_ran(command, done)
        printed += done.stdout
    assert mask_seconds(printed) == mask_seconds(block.text)


def base_config() -> dict:
    with open(os.path.join(REPO_ROOT, "configs", "pt-cifar-tpu-v3-8.json"), encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in ALL_BLOCKS if b.language == "json"])
def test_a_documented_json_block_is_valid(block, tmp_path):
    from core.config import load_config_dir
    from trainguard import wire

    try:
        document = json.loads(block.text)
    except json.JSONDecodeError:
        document = json.loads("{" + block.text + "}")  # a fragment of a config: "key": {...}
    if "schema" in document:
        message, rejections = wire.parse_message(json.dumps(document).encode())
        assert message and not rejections, rejections
        return
    config = base_config()
    section = next(iter(document))
    config[section] = document[section]
    (tmp_path / "doc.json").write_text(json.dumps(config))
    assert load_config_dir(str(tmp_path))
