"""The pytest-compilecache Action's Python side: ``python action/main.py install|plan|restore|headers|save|saved``.

The Action's JavaScript (action/js, run by action.yml's ``main`` and ``post``) calls each command as a
subprocess and does only what needs the cache service: ``@actions/cache``'s ``restoreCache`` and ``saveCache``.
It passes what the client found as JSON in ``COMPILECACHE_FOUND`` / ``COMPILECACHE_SAVES``; a command that has
something to tell it writes one JSON object to the file ``COMPILECACHE_REPLY`` names (:func:`reply`). This file
is the sequence of each command; the work lives in :mod:`action.inputs` (the inputs and the plan),
:mod:`action.transfer` (restoring bundles and headers) and :mod:`action.upload` (the post step's uploads).

main step:

* ``install``: check every input that needs nothing installed, then ``pip install`` the plugin from the
  Action's own checkout (input ``install``), with the extra the store's backend needs (``s3``, ``gcs``,
  ``azure``); ``uv pip install --python`` where the interpreter has no pip (uv's venvs). With
  ``install: false``, warn when the installed plugin is not the Action's version.
* ``plan``: check the inputs, decide whether this run saves, compute the fingerprint and the keys; write
  the plan file (read by every later command), the outputs ``key``, ``cache-dir``, ``report``, and the
  ``PYTEST_COMPILECACHE_*`` variables that configure the plugin in the job's later steps. Reply: what
  action/js restores (:func:`action.inputs.js_plan`).
* ``restore``: unpack the bundle the cache client put in the staging dir (``store: github``) or fetch
  it from the store itself (``s3://``, a directory) into the cache dir; outputs, the restore section of the
  step summary, and the outcome for the plugin (``PYTEST_COMPILECACHE_RESTORED``, see
  :func:`action.transfer.restored_env`). It imports no torch: the plugin loads the bundle's verified
  mega-cache blobs in the pytest process, so a job pays for one torch import, not two. Reply: the header
  entry to restore, if any.
* ``headers``: after the header entry's restore, verify and install the header from it, or from the bundle
  entry's copy (:func:`action.transfer.carry_header`), and tell the plugin.

post step:

* ``save``: what to upload (:func:`action.upload.save_reply`); ``saved``: the result of each upload, in the log
  and the job summary, and one warning if any failed (:mod:`action.upload`).

Why the bundle cannot be packed here: torch's mega-cache artifacts exist only inside the pytest
processes, so the plugin writes the new bundle at the end of the pytest step; see action/README.md.

Exit codes: 0 done, including a restore or an upload that failed (one ``::warning::``, the tests compile
cold, the job's outcome unchanged); 2 an input is invalid (one ``::error::`` naming the input: configuration
errors fail fast).

Everything this file writes for the runner goes through :mod:`pytest_compilecache.ghrunner`, escaped. The
plugin is imported as installed; only the ``install`` step, which runs before it is, imports the Action's
own checkout of the package (its standard-library modules: the option and store tables, ghrunner).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Mapping
from typing import Sequence

# Run as a file (action.yml): the Action's checkout holds the ``action`` package. Appended, so that an installed
# pytest_compilecache wins over the checkout's copy; :func:`installed` looks without it.
CHECKOUT: str | None = None
if not __package__:
    CHECKOUT = str(Path(__file__).resolve().parents[1])
    sys.path.append(CHECKOUT)

from action import inputs  # noqa: E402
from action import transfer  # noqa: E402
from action import upload  # noqa: E402
from action.inputs import RESTORED_ENV  # noqa: E402
from action.inputs import SIGNING_KEY_ENV  # noqa: E402
from action.inputs import InputError  # noqa: E402
from action.inputs import Plan  # noqa: E402


def installed() -> str | None:
    """Where this interpreter has pytest-compilecache installed, or None (the Action's checkout aside).

    Asks every import finder, not only the path ones: an editable install (setuptools' finder on
    ``sys.meta_path``) is installed too; only the checkout's own entry on ``sys.path`` is left out, and
    a copy already imported (the install step imports the checkout's) is not the answer.
    """
    saved = sys.path[:]
    sys.path[:] = [entry for entry in sys.path if entry != CHECKOUT]
    try:
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            try:
                spec = find_spec("pytest_compilecache", None) if find_spec else None
            except (ImportError, ValueError):
                spec = None
            if spec is not None and spec.origin is not None:
                return str(spec.origin)
        return None
    finally:
        sys.path[:] = saved


# ---- runner files: everything goes through ghrunner (escaped)


def write_vars(path: str | None, values: Mapping[str, str]) -> None:
    """Append to a GITHUB_ENV/GITHUB_OUTPUT file: :func:`pytest_compilecache.ghrunner.append_vars`."""
    from pytest_compilecache import ghrunner

    ghrunner.append_vars(path, values)


def reply(environ: Mapping[str, str], data: Mapping[str, Any]) -> None:
    """Tell action/js ``data``: one JSON object in the file ``COMPILECACHE_REPLY`` names (nothing when unset)."""
    path = environ.get("COMPILECACHE_REPLY")
    if path:
        Path(path).write_text(json.dumps(data) + "\n", encoding="utf-8")


def _command(name: str, message: str, title: str = "compile cache") -> None:
    """A workflow command (``::warning::``...), escaped by ghrunner."""
    from pytest_compilecache import ghrunner

    ghrunner.write_command(sys.stdout, name, message, title=title)


# ---- commands


def check_installed(environ: Mapping[str, str]) -> None:
    """``install: false``: the plugin this interpreter imports must be the Action's version (a warning)."""
    origin = installed()
    if origin is None:
        raise InputError(
            f"input install is false but pytest-compilecache is not importable by {sys.executable}: "
            "install it in the step before, or set install: true"
        )
    # Read from its files: this step imports the Action's checkout of the package, not the installed one (main).
    installed_version = inputs.package_version(Path(origin).parent) or "?"
    wanted = inputs.action_version(environ.get("GITHUB_ACTION_PATH", ""))
    if wanted and installed_version != wanted:
        _command(
            "warning",
            f"install: false: the installed pytest-compilecache is {installed_version}, this Action is "
            f"{wanted}; the Action's steps and the plugin may disagree: install {wanted}, or pin the Action "
            f"to the release of {installed_version}",
        )
    else:
        print(f"install: false: using pytest-compilecache {installed_version} from {sys.executable}")


def cmd_install(environ: Mapping[str, str]) -> int:
    inputs.check(environ)  # a mistyped input fails before pip spends a minute
    argv = inputs.install_command(environ)
    if argv is None:
        check_installed(environ)
        return 0
    print("+ " + " ".join(argv), flush=True)
    return subprocess.call(argv)


def cmd_plan(environ: Mapping[str, str]) -> int:
    if installed() is None:
        raise InputError(
            f"pytest-compilecache is not importable by {sys.executable}; keep input "
            "install: true, or install it into the interpreter named by input python"
        )
    from pytest_compilecache.action_api import collect_fingerprint
    from pytest_compilecache.action_api import ghrunner

    temp = Path(inputs.required(environ, "RUNNER_TEMP"))
    if (temp / inputs.PLAN).exists():
        raise InputError(
            "the Action already ran in this job: use it once per job (one pytest-compilecache configuration per job)"
        )
    fingerprint = collect_fingerprint(salt=inputs.key_salt(environ))
    plan = inputs.make_plan(environ, fingerprint)
    ghrunner.write_command(sys.stdout, "group", "compile cache fingerprint (what decides reuse)")
    width = max(len(name) for name in plan.fingerprint)
    for name, value in plan.fingerprint.items():
        # A line starting with "::" would be a command: facts are one escaped line, indented.
        print(f"{ghrunner.one_line(name):<{width}}  {ghrunner.one_line(value)}")
    print(f"{'digest':<{width}}  {plan.digest}")
    ghrunner.write_command(sys.stdout, "endgroup")
    # plan.why quotes GITHUB_REF and the event payload's default branch: one inert line
    why = ghrunner.one_line(plan.why)
    print(f"key {plan.key}; restore prefix {plan.restore_prefix}; saving: {str(plan.save).lower()} ({why})")
    shutil.rmtree(plan.staging, ignore_errors=True)  # only what the cache client restores may be there
    shutil.rmtree(plan.header_staging, ignore_errors=True)
    if plan.transfer != "none":
        from pytest_compilecache.action_api import ConfigError
        from pytest_compilecache.action_api import refuse_foreign

        try:  # the one ownership rule of every entry point that writes a cache dir (pytest's, the CLI's)
            refuse_foreign(plan.cache_dir, "input cache-dir")
        except ConfigError as exc:
            raise InputError(str(exc)) from None
        try:
            Path(plan.cache_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file there, a path no one may create
            raise InputError(f"input cache-dir: cannot make {plan.cache_dir}: {exc.strerror or exc}") from None
    (temp / inputs.PLAN).write_text(json.dumps(plan.to_json(), indent=2) + "\n")
    signing_key = inputs.read(environ, "signing-key")
    from pytest_compilecache.action_api import handover_fingerprint

    # One fingerprint per job: pytest's save reuses this one (when it describes the same install), so steps
    # with another CUDA_VISIBLE_DEVICES or OMP_NUM_THREADS never save under a key the restores never look for.
    env = {**inputs.plugin_env(plan), **handover_fingerprint(fingerprint), **inputs.post_env(plan)}
    if signing_key:
        for line in signing_key.splitlines():
            if line.strip():
                ghrunner.write_command(sys.stdout, "add-mask", line)
        env[SIGNING_KEY_ENV] = signing_key
    write_vars(environ.get("GITHUB_ENV"), env)
    write_vars(environ.get("GITHUB_OUTPUT"), inputs.step_outputs(plan))
    reply(environ, inputs.js_plan(plan))
    return 0


def _plan(environ: Mapping[str, str]) -> Plan:
    """The plan the ``plan`` command wrote (RUNNER_TEMP/compilecache-plan.json)."""
    path = Path(inputs.required(environ, "RUNNER_TEMP")) / inputs.PLAN
    return Plan.from_json(json.loads(path.read_text(encoding="utf-8")))


def cmd_restore(environ: Mapping[str, str]) -> int:
    from pytest_compilecache.action_api import ghrunner
    from pytest_compilecache.action_api import keep_graph_record
    from pytest_compilecache.action_api import restore_outputs

    plan = _plan(environ)
    result = transfer.restore(plan, environ)
    outputs = restore_outputs(result)
    for name, value in outputs.items():
        print(f"{name}={ghrunner.one_line(value)}")
    if result.warning:
        _command("warning", f"{result.warning}; the tests compile cold" if not result.ok else result.warning)
    if result.outcome == "miss":
        print(f"miss: {ghrunner.one_line(result.message)}")
    for line in result.headers.warnings:
        _command("warning", line)
    if result.graphs:
        # The bundle's per-graph record (verified with it): the plugin, which runs with RESTORE=skip, reads
        # it from the cache dir to explain each miss against the bundle.
        try:
            keep_graph_record(Path(plan.cache_dir), result.graphs)
        except (OSError, ValueError) as exc:
            _command("warning", f"could not keep the bundle's graph record (misses stay unexplained): {exc}")
    env = transfer.restored_env(plan, result)
    entry = transfer.header_entry(plan, result)
    if entry is not None:
        # For ``headers``, which completes what the plugin is told once action/js restored the header entry.
        state = {"key": entry[0], "artifact": entry[1].to_json(), "restored": env.get(RESTORED_ENV)}
        (Path(inputs.required(environ, "RUNNER_TEMP")) / inputs.HEADER_STATE).write_text(json.dumps(state) + "\n")
        print(f"precompiled header {entry[1].name}: cache entry {entry[0]}")
        reply(environ, {"header": {"key": entry[0], "path": inputs.HEADER_PATH}})
    write_vars(environ.get("GITHUB_OUTPUT"), outputs)
    write_vars(environ.get("GITHUB_ENV"), env)
    lifted = transfer.gate_lifted(plan, result)
    if lifted:
        print(ghrunner.one_line(lifted))
    if plan.summary:
        try:
            ghrunner.append_summary(environ.get("GITHUB_STEP_SUMMARY"), transfer.restore_markdown(plan, result))
        except OSError as exc:
            _command("warning", f"could not write the step summary: {exc}")
    return 0


def cmd_headers(environ: Mapping[str, str]) -> int:
    """After action/js restored the header entry: install the header (:func:`action.transfer.carry_header`)
    and tell the plugin which header the header entry carries (``header_key`` in ``PYTEST_COMPILECACHE_RESTORED``)."""
    plan = _plan(environ)
    path = Path(inputs.required(environ, "RUNNER_TEMP")) / inputs.HEADER_STATE
    if not path.is_file():
        print("no precompiled header to restore")
        return 0
    try:
        _headers(plan, json.loads(path.read_text()), environ)
    except Exception as exc:  # cache trouble never fails the job: torch builds the header
        _command("warning", f"precompiled header not restored: {type(exc).__name__}: {exc}; torch builds it")
    return 0


def _headers(plan: Plan, state: Mapping[str, Any], environ: Mapping[str, str]) -> None:
    from pytest_compilecache.action_api import ghrunner
    from pytest_compilecache.action_api import header_artifact
    from pytest_compilecache.action_api import human_size

    key, artifact = str(state["key"]), header_artifact(state["artifact"])
    found = transfer.Found.read(environ)
    hit = found.matched == key
    carry = transfer.carry_header(plan, key, artifact, hit)
    if found.problem and not hit:
        print(ghrunner.one_line(f"precompiled header entry {key} not restored: {found.problem}"))
    for line in carry.warnings:
        _command("warning", line)
    if carry.present:
        how = "installed" if carry.installed else "already in torch's dir, checked"
        if carry.elsewhere:  # verified; another process holds torch's build lock for it and publishes it
            how = "being put in torch's dir by another process (it holds torch's build lock), checked"
        where = f"its cache entry {key}" if carry.source == "entry" else "the bundle entry"
        staged = carry.source == "bundle" and carry.carried and plan.save  # the header entry missed
        saving = f"; saved as {key} at job end" if staged else ""
        line = f"precompiled header {artifact.name} ({human_size(artifact.size)}): {how}, from {where}{saving}"
        print(f"{ghrunner.one_line(line)} in {carry.seconds:.1f} s")
        if plan.summary:
            try:
                ghrunner.append_summary(environ.get("GITHUB_STEP_SUMMARY"), ghrunner.md_text(line) + "\n\n")
            except OSError as exc:
                _command("warning", f"could not write the step summary: {exc}")
    # What the restore step told the plugin, completed: the header is in torch's dir (so the plugin's save
    # names it), and the header entry carries it (so the plugin writes no copy into its bundle).
    from pytest_compilecache import action_api as api

    told = str(state["restored"])
    restored = api.read_handoff(told)
    if restored is not None:
        named = (*restored.headers.named, artifact.name) if carry.present else restored.headers.named
        carried = (key,) if carry.carried else restored.headers.carried
        ages = dict(restored.headers.idle)
        if carry.present and artifact.idle:
            ages[artifact.name] = artifact.idle  # the save counts on from the manifest's count
        headers = dataclasses.replace(restored.headers, named=named, carried=carried, idle=ages)
        restored = dataclasses.replace(restored, headers=headers)
        policy = api.read_save_policy(told)
        write_vars(environ.get("GITHUB_ENV"), {RESTORED_ENV: api.write_handoff(restored, policy)})


def cmd_save(environ: Mapping[str, str]) -> int:
    """Post step: tell action/js what to upload (:func:`action.upload.save_reply`). Never fails the job."""
    try:
        plan = _plan(environ)
    except (InputError, OSError, ValueError, TypeError):
        plan = None  # the main step stopped before its plan (an invalid input): nothing to save or say
    try:
        reply(environ, upload.save_reply(plan))
    except Exception as exc:  # cache trouble never fails the job
        _command("warning", f"save skipped: {type(exc).__name__}: {exc}")
    return 0


def cmd_saved(environ: Mapping[str, str]) -> int:
    """Post step, after the uploads: the real result of each, in the log and the job summary; one warning
    when any failed. Never fails the job."""
    from pytest_compilecache.action_api import ghrunner

    results = upload.read_results(environ)
    for saved in results:
        print(f"save: {ghrunner.one_line(upload.describe(saved))}")
    failed = upload.warning(results)
    if failed:
        _command("warning", failed)
    try:
        if _plan(environ).summary:
            ghrunner.append_summary(environ.get("GITHUB_STEP_SUMMARY"), upload.markdown(results))
    except (InputError, OSError, ValueError) as exc:
        _command("warning", f"could not write the step summary: {exc}")
    return 0


COMMANDS: dict[str, Callable[[Mapping[str, str]], int]] = {
    "install": cmd_install,
    "plan": cmd_plan,
    "restore": cmd_restore,
    "headers": cmd_headers,
    "save": cmd_save,
    "saved": cmd_saved,
}


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0] not in COMMANDS:
        print(f"usage: {Path(__file__).name} {{{','.join(COMMANDS)}}}", file=sys.stderr)
        return 2
    if args[0] == "install" and CHECKOUT:
        # Before the Action's version of the plugin is installed, this step imports the package from the Action's
        # checkout (the option and store tables, ghrunner: standard library only), whatever version the
        # interpreter holds: an older one pinned by a requirements file lacks modules this step uses.
        sys.path.insert(0, CHECKOUT)
    try:
        return COMMANDS[args[0]](os.environ if environ is None else environ)
    except InputError as exc:
        _command("error", str(exc), title="pytest-compilecache")
        return 2


if __name__ == "__main__":
    sys.exit(main())
