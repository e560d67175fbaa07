"""What every trainguard command line shares: strict options, two spellings, defaults in --help, one-line errors.

The convention (one for every tool, bound to Beam's spelling of the pipeline's
options): options are spelled with underscores (``--alerts_file``), and every
multi-word option is also accepted with dashes (``--alerts-file``), so older
commands keep working; ``--help`` shows the underscore form. An unknown option
exits with status 2 and names the nearest known one. A failure to reach Google
Cloud (no credentials, an endpoint that does not answer) is one line on stderr
and exit status 1, not a traceback.

Standard library only: the trainer-side distribution ships this module too.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from typing import Iterable, List, Optional, Sequence

USAGE_ERROR, RUNTIME_ERROR = 2, 1  # argparse's exit status for a bad command line, and anything else
DASHES_NOTE = "Options with several words may also be spelled with dashes (--local-store for --local_store)."
_NAMES_A_DEFAULT = re.compile(r"default[: ]", re.IGNORECASE)  # "(default: x)", "Default: x", "(default x)"
_CLOSE_MATCH_CUTOFF = 0.6  # difflib's default: close enough to be a typo, not just a shared prefix


def canonical_spelling(token: str, known: Iterable[str]) -> str:
    """``--alerts-file[=v]`` -> ``--alerts_file[=v]`` when the underscore form is a known option; else unchanged."""
    if not token.startswith("--") or "-" not in token[2:].split("=", 1)[0]:
        return token
    name, sep, value = token.partition("=")
    underscored = "--" + name[2:].replace("-", "_")
    return underscored + sep + value if underscored in set(known) else token


def canonical_argv(argv: Sequence[str], known: Iterable[str]) -> List[str]:
    """Every dashed spelling of a known option in ``argv`` (up to a ``--``) in its underscore form."""
    known = set(known)
    out: List[str] = []
    for index, token in enumerate(argv):
        if token == "--":
            return out + list(argv[index:])
        out.append(canonical_spelling(token, known))
    return out


def nearest_name(name: str, known: Iterable[str]) -> Optional[str]:
    """The known name closest to a mistyped one (difflib), or None when none is close: the guess every tool's
    "did you mean" gives, for an option, a test, a metric or a run."""
    matches = difflib.get_close_matches(name, sorted(set(known)), n=1, cutoff=_CLOSE_MATCH_CUTOFF)
    return matches[0] if matches else None


def nearest_option(option: str, known: Iterable[str]) -> Optional[str]:
    """The known option closest to a mistyped one, in its underscore spelling, or None when none is close."""
    name = option.split("=", 1)[0]
    if name.startswith("--"):
        name = "--" + name[2:].replace("-", "_")
    return nearest_name(name, known)


def unknown_option_message(option: str, known: Iterable[str]) -> str:
    """``unknown option --x (did you mean --y?)``, the one line every tool prints for an option it does not know."""
    name = option.split("=", 1)[0]
    nearest = nearest_option(option, known)
    hint = f" (did you mean {nearest}?)" if nearest else " (see --help)"
    return f"unknown option {name}{hint}"


def comma_separated(text: str) -> List[str]:
    """An option's comma-separated list (``--history_by test,metric``), each part stripped, empty ones left out."""
    return [part.strip() for part in text.split(",") if part.strip()]


def comma_separated_ints(text: str) -> List[int]:
    """An option's comma-separated integers (``--seeds 1,2,3``); a part that is not one exits 2 naming the option
    (as an argparse ``type``)."""
    return [int(part) for part in comma_separated(text)]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown in --help, except empty ones (None, False, []), a flag's (``--no_progress`` would read
    "default: True", the value of what it turns off) and where the help already names one."""

    def _get_help_string(self, action: argparse.Action) -> Optional[str]:
        text = action.help or ""
        if action.default in (None, False, [], argparse.SUPPRESS) or action.nargs == 0 \
                or _NAMES_A_DEFAULT.search(text):
            return action.help
        return super()._get_help_string(action)


class StrictArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser of the convention above: no abbreviations, dashed spellings, a nearest-option hint.

    Sub-command parsers (``add_subparsers``) are of this class too, and apply the same rules.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def known_options(self) -> List[str]:
        """Every option string of this parser and of its sub-commands'."""
        options = list(self._option_string_actions)
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    options += sub.known_options() if isinstance(sub, StrictArgumentParser) else list(
                        sub._option_string_actions)
        return [o for o in options if o.startswith("--")]

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(canonical_argv(args, self._option_string_actions), namespace)

    def parse_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        known = self.known_options()
        for token in canonical_argv(args, known):  # before argparse, which would first miss a required option
            if token == "--":
                break
            if token.startswith("--") and token.split("=", 1)[0] not in known:
                self.error(unknown_option_message(token, known))
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            options = [e for e in extras if e.startswith("-") and e != "-"]
            if options:
                self.error(unknown_option_message(options[0], self.known_options()))
            self.error(f"unexpected argument {extras[0]!r} (see --help)")
        return parsed


def error_line(error: BaseException, limit: int = 300) -> str:
    """The first line of an error's message, cut to ``limit`` characters (client errors often run to pages)."""
    return (str(error).strip().splitlines() or [""])[0][:limit]


def cloud_failure(error: BaseException) -> Optional[str]:
    """One line for an error that means Google Cloud could not be reached as configured; None for any other.

    Recognised by name, so that this module imports no Google library: missing credentials
    (``google.auth.exceptions.DefaultCredentialsError``), and an endpoint that refuses or does not
    answer (connection errors of the standard library, requests/urllib3, and ``google.api_core``'s
    ``ServiceUnavailable``/``RetryError``/``DeadlineExceeded``), and a refusal that retrying cannot mend (a
    project, dataset, table, topic or subscription that does not exist or may not be read: ``NotFound``,
    ``Forbidden``, ``PermissionDenied``, ``Unauthenticated``).
    """
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        names = {cls.__name__ for cls in type(error).__mro__}
        first_line = error_line(error)
        if "DefaultCredentialsError" in names:
            return ("no Google Cloud credentials: run 'gcloud auth application-default login' or set "
                    "GOOGLE_APPLICATION_CREDENTIALS (or point the tool at an emulator)")
        if names & {"ConnectionError", "ServiceUnavailable", "RetryError", "DeadlineExceeded", "NewConnectionError",
                    "MaxRetryError", "TransportError"}:
            return f"cannot reach the endpoint: {type(error).__name__}: {first_line}"
        if names & {"NotFound", "Forbidden", "PermissionDenied", "Unauthenticated"}:
            return f"Google Cloud refused: {type(error).__name__}: {first_line}"
        cause = error.__cause__ or error.__context__
        if cause is None:
            break
        error = cause
    return None


def missing_credentials(error: BaseException) -> bool:
    """Whether the error is Google's "no Application Default Credentials" (retrying cannot help)."""
    return any(cls.__name__ == "DefaultCredentialsError" for cls in type(error).__mro__)


def fail(prog: str, message: str, status: int = RUNTIME_ERROR) -> int:
    """Prints ``prog: error: message`` on stderr and returns ``status`` (for ``return fail(...)`` in a main)."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return status
