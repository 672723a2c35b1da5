"""The CLI's arguments: one parser, its subcommands and their options (:func:`build_parser`).

What each option means is its help; what a command does with it is :mod:`pytest_compilecache.cli`'s. Values
whose checks need more than argparse (keys, store URLs, the plugin's variables) are checked by the commands,
before any work.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING
from typing import Any
from typing import Callable
from typing import Mapping

from .. import ghrunner
from .._env import KEY_PREFIX_ENV
from .._env import KEY_SALT_ENV
from .._version import __version__
from ..settings import DEFAULT_PREFIX

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

Commands = Mapping[str, Callable[[argparse.Namespace], int]]
DESCRIPTION = "``python -m pytest_compilecache``: fingerprint, key, restore, save, inspect, verify, prune, report."


class _Parser(argparse.ArgumentParser):
    """argparse's usage errors, help and version go through :func:`.ghrunner.inert` too: an error echoes
    the argument it refused, whatever it holds."""

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        super()._print_message(ghrunner.inert(message) if message else message, file)


def _epoch(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a Unix time in seconds: {value!r}") from None
    if not number >= 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"not a Unix time in seconds: {value!r}")
    return number - 1.0  # headers.session_start(): a second of slack for coarse file-system clocks


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return number


def _fp_args(p: argparse.ArgumentParser) -> None:
    """The options that change the fingerprint."""
    p.add_argument(
        "--salt",
        type=str.strip,  # as the plugin's settings read it: one salt, one fingerprint
        default=os.environ.get(KEY_SALT_ENV, "").strip(),
        help="key salt",
    )
    p.add_argument("--device-facts", help="JSON file of recorded device facts (instead of asking the GPUs)")


def _key_prefix_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prefix",
        dest="key_prefix",
        metavar="PREFIX",
        help=f"key prefix (default: ${KEY_PREFIX_ENV}, else {DEFAULT_PREFIX}; parsed as the plugin's)",
    )


def _size_limit_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-bundle-size",
        help="refuse bundles larger than this (default: $PYTEST_COMPILECACHE_MAX_BUNDLE_SIZE, else 2G)",
    )


def _store_args(p: argparse.ArgumentParser, prefix: bool = True) -> None:
    """The options of a command that talks to a store."""
    p.add_argument(
        "--store",
        required=True,
        help="directory, file:///path, s3://bucket/prefix, gs://bucket/prefix or az://container/prefix",
    )
    if prefix:
        _key_prefix_arg(p)
    p.add_argument("--strict", action="store_true", help="exit 1 on store or bundle trouble")
    p.add_argument("--s3-endpoint", help="S3-compatible endpoint URL (default: $PYTEST_COMPILECACHE_S3_ENDPOINT)")
    _size_limit_arg(p)
    p.add_argument(
        "--store-timeout",
        help="seconds the command may wait for the store in all "
        "(default: $PYTEST_COMPILECACHE_STORE_TIMEOUT, else 300)",
    )


def _key_commands(sub: Any, commands: Commands) -> None:
    """fingerprint, key: what decides reuse."""
    p = sub.add_parser("fingerprint", help="print the facts that decide reuse, and their digest")
    _fp_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=commands["fingerprint"])

    p = sub.add_parser("key", help="print the save key and the restore prefix")
    _fp_args(p)
    _key_prefix_arg(p)
    p.add_argument("--suffix", help="run suffix (default: time and pid)")
    p.add_argument("--github-output", action="store_true", help="also append to $GITHUB_OUTPUT")
    p.set_defaults(func=commands["key"])


def _store_commands(sub: Any, commands: Commands) -> None:
    """restore, save: a bundle in or out of a store."""
    p = sub.add_parser("restore", help="restore the best matching bundle into a cache dir")
    _fp_args(p)
    _store_args(p)
    p.add_argument("--cache-dir", required=True)
    p.add_argument("--key", help="exact key to try first")
    p.add_argument("--json", help="write the outcome as JSON here")
    p.add_argument("--fail-on-miss", action="store_true", help="exit 3 when nothing matched")
    p.add_argument("--github-output", action="store_true")
    p.add_argument(
        "--no-headers",
        action="store_true",
        help="do not install the precompiled headers the bundle names (by default they go to torch's "
        "header dir under this process's TMPDIR: run restore with the TMPDIR the tests use)",
    )
    p.set_defaults(func=commands["restore"])

    p = sub.add_parser("save", help="bundle a cache dir's reusable entries and save them")
    _fp_args(p)
    _store_args(p)
    p.add_argument("--cache-dir", required=True)
    p.add_argument("--suffix")
    p.add_argument("--keep", type=_positive, default=3)
    headers = p.add_mutually_exclusive_group()
    headers.add_argument(
        "--headers-since",
        type=_epoch,
        metavar="EPOCH",
        help="also carry torch's precompiled headers built or read since this Unix time (take it "
        "with `date +%%s` before the tests; same TMPDIR as the tests)",
    )
    headers.add_argument(
        "--all-headers",
        action="store_true",
        help="also carry every precompiled header in torch's header dir (a fresh CI runner's)",
    )
    p.set_defaults(func=commands["save"])


def _bundle_commands(sub: Any, commands: Commands) -> None:
    """inspect, verify, prune, report."""
    p = sub.add_parser("inspect", help="show a bundle's manifest (does not verify the payload)")
    p.add_argument("bundle")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=commands["inspect"])

    p = sub.add_parser("verify", help="verify checksums, signature and optionally the fingerprint")
    _fp_args(p)
    p.add_argument("bundle")
    p.add_argument("--fingerprint", action="store_true", help="also require this machine's fingerprint")
    _size_limit_arg(p)
    p.set_defaults(func=commands["verify"])

    p = sub.add_parser("prune", help="keep the newest N bundles under a key prefix")
    _store_args(p, prefix=False)
    p.add_argument("--prefix", required=True, help="a key prefix or a lineage, matched as whole parts of a key")
    p.add_argument("--keep", type=_positive, default=3)
    p.set_defaults(func=commands["prune"])

    p = sub.add_parser("report", help="the last session's full report, or a --compile-cache-json file as Markdown")
    p.add_argument("json_report", nargs="?", help="default: the last session's report (pytest's cache, as text)")
    p.add_argument("--text", action="store_true", help="the terminal's full report instead of Markdown")
    p.add_argument("--summary", action="store_true", help="append to $GITHUB_STEP_SUMMARY")
    p.set_defaults(func=commands["report"])


def build_parser(commands: Commands) -> argparse.ArgumentParser:
    """The CLI's parser; each subcommand's ``func`` is its entry of ``commands`` (name -> function)."""
    parser = _Parser(prog="python -m pytest_compilecache", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True)
    _key_commands(sub, commands)
    _store_commands(sub, commands)
    _bundle_commands(sub, commands)
    return parser
