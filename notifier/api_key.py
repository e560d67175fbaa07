"""The SendGrid API key: from an environment variable or Google Secret Manager, never printed.

The key travels wrapped in :class:`Secret`, whose ``str``/``repr`` are masked,
so that logging an object or an exception that holds it cannot leak it.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

DEFAULT_ENV_VAR = "SENDGRID_API_KEY"


class SecretError(RuntimeError):
    """The key could not be found; the message says where it was looked for (never the value)."""


class Secret:
    """A string that does not print itself."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __reduce__(self):  # no pickling into logs or caches either
        raise TypeError("a Secret cannot be pickled")


def secret_version_name(secret: str, project: Optional[str]) -> str:
    """``projects/P/secrets/S/versions/V`` from a full name, ``projects/P/secrets/S`` or a bare ``S``."""
    if secret.startswith("projects/"):
        return secret if "/versions/" in secret else f"{secret}/versions/latest"
    if not project:
        raise SecretError(f"--sendgrid_key_secret {secret!r} is not a full resource name and no project is set "
                          "(--project or GOOGLE_CLOUD_PROJECT)")
    return f"projects/{project}/secrets/{secret}/versions/latest"


def key_from_secret_manager(name: str) -> Secret:
    """Read a secret version with Google Secret Manager (Application Default Credentials)."""
    from google.cloud import secretmanager  # imported only on this path

    client = secretmanager.SecretManagerServiceClient()
    response = client.access_secret_version(request={"name": name})
    value = response.payload.data.decode("utf-8").strip()
    if not value:
        raise SecretError(f"secret {name} is empty")
    return Secret(value)


def key_from_env(environ: Mapping[str, str], var: str = DEFAULT_ENV_VAR) -> Secret:
    value = environ.get(var, "").strip()
    if not value:
        raise SecretError(f"no SendGrid API key: set ${var} or pass --sendgrid_key_secret")
    return Secret(value)


def resolve_api_key(secret: Optional[str], project: Optional[str], environ: Mapping[str, str] = os.environ,
                    env_var: str = DEFAULT_ENV_VAR) -> Secret:
    """The key from Secret Manager when ``secret`` is given, else from ``environ[env_var]``."""
    if secret:
        return key_from_secret_manager(secret_version_name(secret, project or environ.get("GOOGLE_CLOUD_PROJECT")))
    return key_from_env(environ, env_var)
