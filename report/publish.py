"""``--copy_to``: each run's picture next to the run's model artifacts, in a local directory or on GCS.

The destination is a directory template: ``{test}`` and ``{run}`` in it are replaced by the test and
the run ids as they are (``gs://models/{test}/{run}/trainguard``); without either, pictures go to
``<destination>/<test>/<run>/``. The copy is named by the run: ``<run>.png``. Ids are how the training
jobs' own artifacts are laid out, so they are kept as written (unlike the report's directory, whose file
names are digests, ``data.safe_name``); only what could not stay one path component is escaped
(:func:`path_name`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from typing import Any, Callable, Iterable, List, Optional, Tuple

GCS = "gs://"
# What cannot be part of one path component: separators and control characters; and "%", the escape itself,
# so that two ids never share a directory ("a/b" is "a%2Fb", "a%2Fb" is "a%252Fb").
UNSAFE = re.compile(r"[/\\%\x00-\x1f\x7f]")
MAX_NAME_BYTES = 200  # most file systems allow 255 bytes per component; room for ".png" and a digest


def path_name(name: str) -> str:
    """A test or run id as one path component: unchanged unless it has to be, with ``/``, ``\\``, control
    characters and ``%`` percent-escaped (``a/b`` -> ``a%2Fb``), ``.`` and ``..`` escaped as ``%2E``, and a
    name over ``MAX_NAME_BYTES`` bytes cut, with a digest of the whole name after the cut."""
    escaped = UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode("utf-8")), name)
    if escaped in (".", ".."):
        escaped = escaped.replace(".", "%2E")
    encoded = escaped.encode("utf-8", "surrogatepass")
    if len(encoded) <= MAX_NAME_BYTES:
        return escaped
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return encoded[:MAX_NAME_BYTES - 11].decode("utf-8", "ignore") + "-" + digest


def destination(template: str, test: str, run: str) -> str:
    """The directory of one run's pictures."""
    if "{test}" in template or "{run}" in template:
        return template.replace("{test}", path_name(test)).replace("{run}", path_name(run))
    return join(template, path_name(test), path_name(run))


def copy_name(run: str) -> str:
    """The copy's file name: the run id."""
    return path_name(run) + ".png"


def join(directory: str, *names: str) -> str:
    """A path under ``directory``, local or ``gs://``."""
    if directory.startswith(GCS):
        return "/".join([directory.rstrip("/"), *names])
    return os.path.join(directory, *names)


class Copier:
    """Copies files into local or ``gs://`` directories (one storage client, made on first use)."""

    def __init__(self, storage_client: Optional[Callable[[], object]] = None):
        self._make_client = storage_client or default_storage_client
        self._client: Any = None

    def copy(self, source: str, directory: str, name: Optional[str] = None) -> str:
        """Copies ``source`` into ``directory`` as ``name`` (default: its own name); returns the copy's path."""
        target = join(directory, name or os.path.basename(source))
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
    """Copies each (test, run, local file) to the run's destination as ``<run>.png``; returns the copies' paths."""
    copier = copier or Copier()
    return [copier.copy(path, destination(template, test, run), copy_name(run)) for test, run, path in pictures]
