"""``python -m pytest_compilecache``: fingerprint, key, restore, save, inspect, verify, prune, report.

Exit codes (stable, documented in docs/cli.md):

* 0 - done (a restore that misses is done too: the next session compiles cold; store or bundle trouble
  without ``--strict`` is one ``CompileCacheWarning`` line on stderr and exit 0)
* 1 - ``verify``/``inspect``: the bundle is invalid or unreadable; ``restore``/``save``/``prune`` with
  ``--strict``: the store or bundle failed; ``prune`` without it: the store refused
* 2 - bad usage, checked before any work: unknown option, malformed store URL, bad key, prefix or suffix,
  a ``--json`` path that cannot be written, device facts or a report file of the wrong shape (any input
  ``report`` cannot render: not JSON, nested too deep, a number out of range, a field of the wrong type)
* 3 - ``restore --fail-on-miss``: nothing usable matched

Every failure is one ``error: ...`` line on stderr, never a traceback. Everything written for a CI runner
(``--github-output``, workflow commands, the step summary, and every line printed on stdout or stderr,
argparse's included) goes through :mod:`.ghrunner`, escaped: no output is ever a workflow command.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Sequence

from .. import bundle
from .. import cachedir
from .. import ghrunner
from .. import report
from .. import sync
from .._fs import atomic_file
from .._fs import report_target
from ..errors import BundleError
from ..errors import ConfigError
from ..errors import StoreError
from ..fingerprint import collect
from ..fingerprint import default_suffix
from ..fingerprint import key_rest
from ..fingerprint import make_key
from ..fingerprint import restore_prefix
from ..probe import point_cache_dir
from ..settings import from_environment
from ..settings import read_signing_key
from ..stores import OPTION as STORE_OPTION
from ..stores import backend_keywords
from ..stores import open_store
from ..stores import refuse_cache_dir
from ..stores.base import prune
from ..stores.base import validate_key
from ..stores.base import validate_prefix
from ..stores.timed import TimedStore
from .arguments import build_parser

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_MISS = 0, 1, 2, 3

# Where `save` looks in a cache dir: torch's FX and AOTAutograd entries, compiled kernels, best configs, and
# what a fresh GPU runner would rebuild: triton's cache entries (kernels, which torch's bundle lacks
# when triton bundling is off; gcc-built helpers such as cuda_utils.so; launchers) and torch's local autotuning
# results (<cache>/cache/: max-autotune's GEMM timings). What it carries of them: cachedir.carried_file.
_DIR_PATTERNS = (
    "fxgraph/**/*",
    "aotautograd/**/*",
    "*/*.so",
    "*.best_config",
    "*/*.best_config",
    "triton/*/*",
    "triton/*/*/*",
    "cache/*",
)


def _check_names(args: argparse.Namespace) -> None:
    """Validate keys, prune's prefix and suffixes before any work (exit 2 on a bad one, naming the flag). The key
    prefix of key, restore and save is the plugin's option, parsed as the plugin parses it (:data:`_PLUGIN_FLAGS`)."""
    for name, check in (("prefix", validate_prefix), ("key", validate_key), ("suffix", validate_key)):
        value = getattr(args, name, None)
        if value is None or (not value and name != "prefix"):
            continue
        try:
            check(value)
        except ConfigError as exc:
            raise ConfigError(f"--{name}: {exc}") from None


def _runner_file(variable: str, flag: str) -> str:
    """The runner file ``variable`` names, for ``flag``: checked before any work, so a restore never fills a cache
    dir and then fails to report it. Unset, or not a file this process can append to: a ConfigError (exit 2)."""
    path = os.environ.get(variable, "")
    if not path:
        raise ConfigError(f"{flag}: {variable} is not set (the runner sets it in a GitHub Actions step)")
    try:  # tried, not guessed from its mode bits; a file made to try is removed (the runner makes its own)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
        except FileNotFoundError:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            os.unlink(path)
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot append to {variable} {path}: {exc.strerror or exc}") from None
    return path


def _json_target(path: str | None) -> Path | None:
    """The ``--json`` file: its dir is made now, so a bad path is a usage error before any work."""
    return report_target(path, "--json") if path else None


def _open(args: argparse.Namespace, readonly: bool = False) -> Any:
    """The store of ``--store``, its calls bounded in all by ``--store-timeout`` (as the plugin's)."""
    # The plugin's store options, passed on as the store's backend takes them (a gs:// store takes no S3 endpoint).
    try:
        options = backend_keywords(args.store, {"s3_endpoint": args.s3_endpoint})
        store = open_store(args.store, readonly=readonly, **options)
    except ConfigError as exc:  # the stores name the plugin's option; here the user typed --store
        raise exc.respelled(STORE_OPTION, "--store") from None
    return TimedStore(store, args.store_timeout, option="--store-timeout")


# The flags that default to the plugin's variables (settings.OPTIONS names and parses them): one key prefix, one
# size limit for a command and a session of the same job.
_PLUGIN_FLAGS = {
    "key_prefix": "--prefix",
    "s3_endpoint": "--s3-endpoint",
    "max_bundle_size": "--max-bundle-size",
    "store_timeout": "--store-timeout",
}


def _check_cache_dir(store: str, cache_dir: str) -> None:
    """A directory ``--store`` must not be ``--cache-dir``, nor hold it or lie in it (exit 2)."""
    try:
        refuse_cache_dir(store, cache_dir)
    except ConfigError as exc:
        raise exc.respelled(STORE_OPTION, "--store") from None


def _resolve_plugin_defaults(args: argparse.Namespace) -> None:
    """Each of :data:`_PLUGIN_FLAGS` from its flag, else the plugin's variable, else the plugin's default,
    checked before the command does anything: a bad value is a ConfigError naming what was given (exit 2)."""
    for name, flag in _PLUGIN_FLAGS.items():
        if hasattr(args, name):
            setattr(args, name, from_environment(name, getattr(args, name), flag))


def _signing_key() -> bytes | None:
    """The signing key from the environment (never from the command line, where ``ps`` would show it)."""
    return read_signing_key()


def _progress(label: str) -> Any:
    """A tiny progress line on stderr for long transfers (only on a terminal)."""
    started = time.perf_counter()

    def done(size: int | None = None) -> None:
        if sys.stderr.isatty():
            extra = f", {size / 2**20:.1f} MiB" if size else ""
            sys.stderr.write(f"\r{ghrunner.one_line(label)}: done in {time.perf_counter() - started:.1f} s{extra}\n")

    if sys.stderr.isatty():
        sys.stderr.write(f"{ghrunner.one_line(label)}...")
        sys.stderr.flush()
    return done


def _fingerprint(args: argparse.Namespace) -> Any:
    device = None
    if getattr(args, "device_facts", None):
        try:
            device = json.loads(Path(args.device_facts).read_text())
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
            raise ConfigError(f"--device-facts: cannot read {args.device_facts}: {exc}") from None
    try:
        return collect(salt=args.salt, device=device)
    except ConfigError as exc:
        raise ConfigError(f"--device-facts: {exc}") from None


def cmd_fingerprint(args: argparse.Namespace) -> int:
    fp = _fingerprint(args)
    if args.json:
        _out_json({"digest": fp.digest(), "facts": fp.to_json()})
    else:
        width = max(len(k) for k in fp.facts)
        for name, value in fp.to_json().items():  # a salt or recorded GPU names may hold anything
            _out(f"{ghrunner.one_line(name, 200):<{width}}  {ghrunner.one_line(value, 500)}")
        _out(f"{'digest':<{width}}  {fp.digest()}")
    return EXIT_OK


def cmd_key(args: argparse.Namespace) -> int:
    _check_names(args)
    output = _runner_file("GITHUB_OUTPUT", "--github-output") if args.github_output else None
    fp = _fingerprint(args)
    values = {
        "digest": fp.digest(),
        "key": make_key(args.key_prefix, fp.digest(), args.suffix or default_suffix()),
        "restore-prefix": restore_prefix(args.key_prefix, fp.digest()),
    }
    _emit(values, output)
    return EXIT_OK


def _emit(values: dict[str, str], output: str | None) -> None:
    """Print ``values`` as ``name=value`` lines, and append them to the ``GITHUB_OUTPUT`` file ``output`` (if any)."""
    for name, value in values.items():
        _out(f"{name}={ghrunner.one_line(value)}")
    if output:
        ghrunner.append_vars(output, values)


def cmd_restore(args: argparse.Namespace) -> int:
    _check_names(args)
    json_target = _json_target(args.json)
    output = _runner_file("GITHUB_OUTPUT", "--github-output") if args.github_output else None
    cache_dir = str(Path(args.cache_dir).absolute())
    store = _open(args, readonly=True)
    _check_cache_dir(args.store, cache_dir)
    try:  # the rules pytest's --compile-cache-dir follows: not someone else's dir, a writable dir (made below)
        cachedir.refuse_foreign(cache_dir, "--cache-dir")
    except ConfigError as exc:
        raise exc.respelled("--compile-cache-dir", "--cache-dir") from None
    unsafe = cachedir.unsafe_dir_reason(cache_dir)  # as pytest refuses it: torch could not build in it
    if unsafe is not None:
        raise ConfigError(f"--cache-dir: {ghrunner.one_line(cache_dir)} {unsafe}")
    point_cache_dir(cache_dir)  # before torch is imported by the fingerprint
    fingerprint = _fingerprint(args)  # a bad --device-facts is a usage error before the dir is made
    try:
        cachedir.make_dir(Path(cache_dir))
    except ConfigError as exc:
        raise exc.respelled("--compile-cache-dir", "--cache-dir") from None
    cachedir.sweep_dead_writers(cache_dir)  # what a killed restore left (its staging dir), once its owner is gone
    done = _progress(f"restoring from {store.location}")
    result = sync.restore(
        store,
        prefix=args.key_prefix,
        fingerprint=fingerprint,
        cache_dir=cache_dir,
        signing_key=_signing_key(),
        exact_key=args.key,
        max_bytes=args.max_bundle_size,
        headers=not args.no_headers,
    )
    done(result.size)
    _emit(sync.restore_outputs(result), output)
    if result.headers.transferred:
        _out(
            f"installed {len(result.headers.transferred)} precompiled header(s), "
            f"{result.headers.size / 2**20:.1f} MiB, in {result.headers.seconds:.1f} s",
            err=True,
        )
    for line in result.headers.warnings:
        _warn(line)
    if json_target is not None:
        json_target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(json_target, fsync=False) as fh:
            fh.write((json.dumps(result.to_json(), indent=2) + "\n").encode())
    if result.warning:
        _warn(result.warning)
    if args.strict and (not result.ok or result.skipped):
        return EXIT_FAILED  # store trouble, or bad bundles in the store
    if not result.ok:
        return EXIT_MISS if args.fail_on_miss else EXIT_OK  # nothing usable was restored
    if result.outcome == "miss":
        _out(f"miss: {ghrunner.one_line(result.message)}", err=True)
        return EXIT_MISS if args.fail_on_miss else EXIT_OK
    return EXIT_OK


def _unlinked(cache_dir: Path, path: Path) -> bool:
    """Is ``path`` reached from ``cache_dir`` without a link (glob goes through a linked dir; a bundle never)?"""
    while path != cache_dir:
        if path.is_symlink():
            return False
        path = path.parent
    return True


def cmd_save(args: argparse.Namespace) -> int:
    _check_names(args)
    cache_dir = Path(args.cache_dir).absolute()
    store = _open(args)  # a bad --store is a usage error before anything else
    _check_cache_dir(args.store, str(cache_dir))
    if not cache_dir.is_dir():  # nothing compiled there, or a mistyped path: either way, said
        _out(f"save: skipped: --cache-dir {ghrunner.one_line(str(cache_dir))} is not a directory: nothing to save")
        return EXIT_OK
    found = {
        str(p.relative_to(cache_dir)).replace(os.sep, "/") for pattern in _DIR_PATTERNS for p in cache_dir.glob(pattern)
    }
    files = sorted(
        rel
        for rel in found
        if cachedir.carried_file(rel) and (cache_dir / rel).is_file() and _unlinked(cache_dir, cache_dir / rel)
    )
    if not files:  # a bundle of nothing would be restored as one, and its save would prune the useful ones
        _out(f"save: skipped: --cache-dir {ghrunner.one_line(str(cache_dir))} holds no compiled files: nothing to save")
        return EXIT_OK
    done = _progress(f"saving to {store.location}")
    result = sync.save(
        store,
        prefix=args.key_prefix,
        fingerprint=_fingerprint(args),
        suffix=args.suffix or default_suffix(),
        cache_dir=str(cache_dir),
        blobs={},
        files=files,
        stats={},
        signing_key=_signing_key(),
        keep=args.keep,
        max_bytes=args.max_bundle_size,
        header_since=0.0 if args.all_headers else args.headers_since,
    )
    done(result.size)
    _out(f"save: {result.outcome} {result.key or ''} {ghrunner.one_line(result.message)}".rstrip())
    if result.headers.named:
        named, uploaded = len(result.headers.named), len(result.headers.transferred)
        _out(f"save: names {named} precompiled header(s), uploaded {uploaded}")
    for line in result.headers.warnings:
        _warn(line)
    if result.warning:
        _warn(result.warning)
        return EXIT_FAILED if args.strict else EXIT_OK
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    manifest = bundle.read_manifest(Path(args.bundle))  # the header only: unverified, and said so below
    data = json.loads(manifest.to_json_bytes())
    data["signed"] = bundle.is_signed(Path(args.bundle))
    if args.json:
        _out_json(data)  # an unverified bundle's text: valid JSON, never a runner command
        return EXIT_OK
    line = ghrunner.one_line  # an unverified bundle's text: never a runner command, never two lines
    _out(f"key          {line(manifest.key, 300)}")
    _out(f"created      {line(manifest.created, 100)}")
    _out(f"plugin/torch {line(manifest.plugin_version, 100)} / {line(manifest.torch_version, 100)}")
    _out(f"digest       {line(manifest.digest, 100)}")
    _out(f"signed       {'yes' if data['signed'] else 'no'}")
    _out(f"members      {len(manifest.members)} ({manifest.total_size} bytes, payload {manifest.payload_size})")
    for member in manifest.members:
        _out(f"  {member.size:>10}  {line(member.path, 500)}")
    # Files the bundle names but the store holds beside it, once (torch's precompiled headers), by sha256.
    _out(f"artifacts    {len(manifest.artifacts)} (stored beside the bundle, by sha256)")
    for artifact in manifest.artifacts:
        kind, name, sha256 = line(artifact.kind, 100), line(artifact.name, 300), line(artifact.sha256, 100)
        idle = f"  unused in the last {artifact.idle} save{'s' if artifact.idle != 1 else ''}" if artifact.idle else ""
        _out(f"  {artifact.size:>10}  {kind}  {name}  sha256 {sha256}{idle}")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    fingerprint = _fingerprint(args).to_json() if args.fingerprint else None
    try:
        with bundle.verify(
            Path(args.bundle), signing_key=_signing_key(), fingerprint=fingerprint, max_bytes=args.max_bundle_size
        ) as verified:
            manifest = verified.manifest
    except BundleError as exc:
        _out(f"invalid: {ghrunner.one_line(_as_typed(str(exc)))}")
        return EXIT_FAILED
    _out(f"ok: {ghrunner.one_line(manifest.key, 300)} ({len(manifest.members)} members)")
    return EXIT_OK


def cmd_prune(args: argparse.Namespace) -> int:
    _check_names(args)
    rest = key_rest(args.prefix)
    deleted = prune(_open(args), args.prefix, args.keep, magic=bundle.MAGIC, rest=rest)
    for key in deleted:
        _out(f"deleted {key}")
    _out(f"kept the newest {args.keep} under {args.prefix!r}; deleted {len(deleted)}")
    return EXIT_OK


_REPORT_MAX = 1 << 30  # a JSON report of a million tests is a few hundred MiB


def cmd_report(args: argparse.Namespace) -> int:
    """Render a ``--compile-cache-json`` file as Markdown (appended to $GITHUB_STEP_SUMMARY with --summary).

    Any input that is not such a report (unreadable, not JSON, nested too deep, a number out of range, a
    field of the wrong type) is a ConfigError: one ``error:`` line and exit 2, never a traceback or exit 1."""
    kept = not args.json_report  # the last session's report, kept in pytest's cache
    # --summary outside a runner prints the report; a summary file that cannot be written is said before any work
    target = (
        _runner_file("GITHUB_STEP_SUMMARY", "--summary")
        if args.summary and os.environ.get("GITHUB_STEP_SUMMARY")
        else None
    )
    args.json_report = args.json_report or report.LAST_REPORT_PATH
    try:
        with os.fdopen(os.open(args.json_report, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as fh:
            info = os.fstat(fh.fileno())
            # /dev/zero, a FIFO, a mistyped huge file: a usage error, not a MemoryError nor a wait
            raw = fh.read() if stat.S_ISREG(info.st_mode) and info.st_size <= _REPORT_MAX else None
    except OSError as exc:
        hint = " (no session kept a report here: run pytest in this directory first)" if kept else ""
        raise ConfigError(f"cannot read {args.json_report}: {exc.strerror or exc}{hint}") from None
    if raw is None:
        raise ConfigError(f"{args.json_report} is not a --compile-cache-json report: not a file of at most 1 GiB")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
        raise ConfigError(f"{args.json_report} is not JSON: {type(exc).__name__}: {exc}") from None
    try:
        text = report.full_text(data) if args.text or (kept and not args.summary) else _render_report(data)
    except Exception as exc:  # whatever the input makes the renderer raise (OverflowError for 1e999...): its shape
        why = f"{type(exc).__name__}: {exc}"
        raise ConfigError(f"{args.json_report} is not a --compile-cache-json report ({why})") from None
    if target:  # the text (test ids, warnings) shown as it is: nothing in it read as Markdown or HTML
        ghrunner.append_summary(target, ghrunner.md_block(text) if args.text else text)
    else:
        _out(text)
    return EXIT_OK


def _render_report(data: Any) -> str:
    """The Markdown of report ``data`` (the step summary's); any exception means it is not a report of ours."""
    return report.session_markdown(report.outcome_from_json(data))


def _out(text: str = "", *, err: bool = False) -> None:
    """Print ``text`` (a line, or a block such as the report's Markdown) to stdout, or stderr with ``err``:
    the one way this module writes for a person, through :func:`.ghrunner.inert`, since a CI runner reads
    both streams for workflow commands."""
    print(ghrunner.inert(text), file=sys.stderr if err else sys.stdout)


def _out_json(data: Any) -> None:
    """Print ``data`` as indented JSON on stdout, through :func:`.ghrunner.inert_json` (still the same JSON)."""
    print(ghrunner.inert_json(json.dumps(data, indent=2)))


# The plugin's flags a message may name, as this CLI's: a size limit given here is --max-bundle-size.
_AS_TYPED = {"(--compile-cache-max-bundle-size)": "(--max-bundle-size)"}


def _as_typed(message: str) -> str:
    """``message`` naming this CLI's flags where it names the plugin's (:data:`_AS_TYPED`)."""
    for plugin_flag, flag in _AS_TYPED.items():
        message = message.replace(plugin_flag, flag)
    return message


def _warn(message: str) -> None:
    message = _as_typed(message)
    _out(f"CompileCacheWarning: {ghrunner.one_line(message)}", err=True)
    if ghrunner.in_github_actions():
        ghrunner.write_command(sys.stdout, "warning", message, title="compile cache")


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "fingerprint": cmd_fingerprint,
    "key": cmd_key,
    "restore": cmd_restore,
    "save": cmd_save,
    "inspect": cmd_inspect,
    "verify": cmd_verify,
    "prune": cmd_prune,
    "report": cmd_report,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser(COMMANDS).parse_args(argv)
    try:
        _resolve_plugin_defaults(args)
        return int(args.func(args))
    except ConfigError as exc:
        _out(f"error: {ghrunner.one_line(str(exc))}", err=True)
        return EXIT_USAGE
    except (BundleError, StoreError, OSError, ValueError) as exc:
        _out(f"error: {ghrunner.one_line(str(exc))}", err=True)
        return EXIT_FAILED
    except Exception as exc:  # a bug or an SDK surprise: still one line, and the cause for a bug report
        _out(f"error: {type(exc).__name__}: {ghrunner.one_line(str(exc))}", err=True)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
