"""``--copy_to``: each run's picture next to the run's model artifacts, in a local directory or on GCS.

The destination is a directory template: ``{test}`` and ``{run}`` in it are replaced by the
file-safe names of the test and the run (``gs://models/{test}/{run}/trainguard``); without
either, pictures go to ``<destination>/<test>/<run>/``.
"""

from __future__ import annotations

import os
import shutil
from typing import Callable, Iterable, List, Optional, Tuple

from report.data import safe_name

GCS = "gs://"


def destination(template: str, test: str, run: str) -> str:
    """The directory of one run's pictures."""
    if "{test}" in template or "{run}" in template:
        return template.replace("{test}", safe_name(test)).replace("{run}", safe_name(run))
    return join(template, safe_name(test), safe_name(run))


def join(directory: str, *names: str) -> str:
    """A path under ``directory``, local or ``gs://``."""
    if directory.startswith(GCS):
        return "/".join([directory.rstrip("/"), *names])
    return os.path.join(directory, *names)


class Copier:
    """Copies files into local or ``gs://`` directories (one storage client, made on first use)."""

    def __init__(self, storage_client: Optional[Callable[[], object]] = None):
        self._make_client = storage_client or default_storage_client
        self._client = None

    def copy(self, source: str, directory: str) -> str:
        """Copies ``source`` into ``directory`` under its own name; returns the copy's path."""
        target = join(directory, os.path.basename(source))
        if directory.startswith(GCS):
            bucket, _, blob = target[len(GCS):].partition("/")
            if self._client is None:
                self._client = self._make_client()
            self._client.bucket(bucket).blob(blob).upload_from_filename(source, content_type="image/png")
        else:
            os.makedirs(directory, exist_ok=True)
            shutil.copyfile(source, target)
        return target


def default_storage_client():
    from google.cloud import storage

    return storage.Client()


def copy_run_pictures(pictures: Iterable[Tuple[str, str, str]], template: str,
                      copier: Optional[Copier] = None) -> List[str]:
    """Copies each (test, run, local file) to the run's destination; returns the copies' paths."""
    copier = copier or Copier()
    return [copier.copy(path, destination(template, test, run)) for test, run, path in pictures]
