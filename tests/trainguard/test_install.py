"""A training job's install holds the trainer package only (trainer/pyproject.toml), and it imports without Beam."""

import email.parser
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from tests.support import REPO_ROOT

TRAINER = os.path.join(REPO_ROOT, "trainer")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The trainer distribution's wheel, built offline from a copy (the build leaves files behind)."""
    work = tmp_path_factory.mktemp("trainer")
    source = work / "trainer"
    shutil.copytree(TRAINER, source, symlinks=False, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", str(source),
                    "-w", str(work / "dist")], check=True, capture_output=True)
    [built] = (work / "dist").glob("trainguard-*.whl")
    return built


def test_the_wheel_holds_the_trainguard_package_and_nothing_else(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert top == {"trainguard", "trainguard-0.1.0.dist-info"}
    packaged = {name for name in names if name.endswith(".py")}
    in_repo = {os.path.relpath(os.path.join(d, f), REPO_ROOT) for d, _, files in os.walk(os.path.join(REPO_ROOT, "trainguard"))
               for f in files if f.endswith(".py")}
    assert packaged == in_repo


def test_its_dependencies_are_light_and_the_shipper_is_a_console_script(wheel):
    with zipfile.ZipFile(wheel) as z:
        metadata = email.parser.Parser().parsestr(z.read("trainguard-0.1.0.dist-info/METADATA").decode())
        scripts = z.read("trainguard-0.1.0.dist-info/entry_points.txt").decode()
    requires = metadata.get_all("Requires-Dist")
    assert metadata["Name"] == "trainguard"
    # orjson and numpy: the fast paths of the trainer's encoder (trainguard/encoding.py), which a training job must get
    assert [r for r in requires if "extra ==" not in r] == ["google-cloud-pubsub<3,>=2.18", "orjson<4,>=3.9.7",
                                                            "numpy>=1.21"]
    assert not [r for r in requires if "beam" in r or "duckdb" in r or "sendgrid" in r]
    assert set(metadata.get_all("Provides-Extra")) == {"shipper", "system"}
    assert "trainguard-ship = trainguard.shipper:main" in scripts


def test_it_imports_from_the_wheel_alone_with_the_standard_library(wheel, tmp_path):
    zipfile.ZipFile(wheel).extractall(tmp_path)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import trainguard, trainguard.handlers, trainguard.shipper; "
            "assert trainguard.__file__.startswith(sys.argv[1]), trainguard.__file__; "
            "loaded = {m.split('.')[0] for m in sys.modules}; "
            "assert not loaded & {'apache_beam', 'core', 'pipeline', 'transforms', 'sinks', 'google'}, loaded")
    # -S: no site-packages, so nothing installed in this environment can stand in for the wheel
    subprocess.run([sys.executable, "-S", "-c", code, str(tmp_path)], check=True, capture_output=True, text=True)


def test_the_pipeline_sdist_takes_the_trainers_dependencies_from_the_trainers_one_declaration(tmp_path):
    """setup.py reads the trainer's dependencies, extras and entry point from trainer/pyproject.toml (declared
    once); the sdist Dataflow's ``--setup_file`` builds carries that file, so a worker building it from the
    sdist gets the same requirements."""
    source = tmp_path / "repo"
    shutil.copytree(REPO_ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".venv", ".git", "__pycache__", "build", "*.egg-info", "bench", "tests", "data", "docs", "node_modules"))
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "dist")], cwd=source,
                   check=True, capture_output=True)
    [sdist] = (tmp_path / "dist").glob("trainguard_pipeline-*.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    [unpacked] = (tmp_path / "unpacked").iterdir()
    assert (unpacked / "trainer" / "pyproject.toml").is_file()
    subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "-e", str(tmp_path)], cwd=unpacked, check=True,
                   capture_output=True)
    requires = (tmp_path / "trainguard_pipeline.egg-info" / "requires.txt").read_text().split("\n\n")[0].split()
    assert {"google-cloud-pubsub<3,>=2.18", "orjson<4,>=3.9.7", "numpy>=1.21"} <= set(requires)
    scripts = (tmp_path / "trainguard_pipeline.egg-info" / "entry_points.txt").read_text()
    assert "trainguard-ship = trainguard.shipper:main" in scripts
