"""A small stand-in for the GitHub Actions runner: enough of it to run action.yml's steps for real, here.

* :func:`evaluate` / :func:`render`: the subset of GitHub's expression language that action.yml and these
  tests use (contexts ``inputs``, ``steps``, ``github``, ``runner``, ``env``; literals; ``==`` ``!=`` ``&&``
  ``||`` ``!``; ``success()`` ``always()`` ``failure()``). Anything else raises :class:`ExpressionError`,
  so a new expression in action.yml fails the tests loudly instead of evaluating to something plausible.
* :class:`FakeActionsCache`: ``actions/cache`` semantics on directories: entries are immutable and
  versioned by their ``path`` list; restore tries the exact key, then each restore key in order, taking
  the newest entry whose key starts with it, from the job's own ref or the default branch.
* :class:`Job`: one job on a fresh runner: per-step ``GITHUB_ENV``/``GITHUB_OUTPUT``/``GITHUB_STEP_SUMMARY``
  files, ``run:`` scripts through ``bash --noprofile --norc -eo pipefail``, composite actions (``uses:
  ./``) step by step with ``if:`` and ``continue-on-error``, the fake ``actions/cache@v4``,
  ``actions/cache/restore@v4`` and ``actions/cache/save@v4``, and post steps at job end (``post-if:
  success()``), in reverse order.
"""

from __future__ import annotations

import glob
import hashlib
import itertools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Mapping

import yaml

__all__ = ["ExpressionError", "FakeActionsCache", "Job", "StepResult", "evaluate", "parse_vars", "render"]

DEFAULT_REF = "refs/heads/main"


class ExpressionError(Exception):
    """An expression outside the supported subset, or one that refers to something undefined."""


# ---- expressions

_TOKEN = re.compile(
    r"\s*(?:(?P<string>'(?:[^']|'')*')|(?P<op>==|!=|&&|\|\||!|\(|\))|(?P<number>\d+(?:\.\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_][A-Za-z0-9_-]*)*))"
)
_FUNCTIONS = ("success", "always", "failure")


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match or match.end() == pos:
            raise ExpressionError(f"unsupported syntax at {text[pos:]!r} in {text!r}")
        kind = match.lastgroup or ""
        tokens.append((kind, match.group(kind)))
        pos = match.end()
    return tokens


class _Parser:
    def __init__(self, text: str, context: Mapping[str, Any]) -> None:
        self.text, self.context = text, context
        self.tokens = _tokens(text)
        self.pos = 0

    def parse(self) -> Any:
        value = self._or()
        if self.pos != len(self.tokens):
            raise ExpressionError(f"unexpected {self.tokens[self.pos][1]!r} in {self.text!r}")
        return value

    def _peek(self) -> str | None:
        return self.tokens[self.pos][1] if self.pos < len(self.tokens) else None

    def _take(self) -> tuple[str, str]:
        if self.pos >= len(self.tokens):
            raise ExpressionError(f"unexpected end of {self.text!r}")
        self.pos += 1
        return self.tokens[self.pos - 1]

    def _or(self) -> Any:
        value = self._and()
        while self._peek() == "||":
            self._take()
            right = self._and()
            value = value if _truthy(value) else right
        return value

    def _and(self) -> Any:
        value = self._unary()
        while self._peek() == "&&":
            self._take()
            right = self._unary()
            value = right if _truthy(value) else value
        return value

    def _unary(self) -> Any:
        if self._peek() == "!":
            self._take()
            return not _truthy(self._unary())
        return self._comparison()

    def _comparison(self) -> Any:
        left = self._primary()
        if self._peek() in ("==", "!="):
            op = self._take()[1]
            equal = _equal(left, self._primary())
            return equal if op == "==" else not equal
        return left

    def _primary(self) -> Any:
        kind, text = self._take()
        if text == "(" and kind == "op":
            value = self._or()
            if self._take()[1] != ")":
                raise ExpressionError(f"missing ')' in {self.text!r}")
            return value
        if kind == "string":
            return text[1:-1].replace("''", "'")
        if kind == "number":
            return float(text)
        if kind != "name":
            raise ExpressionError(f"unexpected {text!r} in {self.text!r}")
        if text in ("true", "false"):
            return text == "true"
        if text == "null":
            return None
        if self._peek() == "(":
            if text not in _FUNCTIONS:
                raise ExpressionError(f"function {text}() is not supported (in {self.text!r})")
            self._take()
            if self._take()[1] != ")":
                raise ExpressionError(f"{text}() takes no arguments here (in {self.text!r})")
            return self.context["__status__"](text)
        return _lookup(text, self.context, self.text)


def _lookup(path: str, context: Mapping[str, Any], text: str) -> Any:
    head, *rest = path.split(".")
    if head not in context or head.startswith("__"):
        raise ExpressionError(f"context {head!r} is not supported (in {text!r})")
    value = context[head]
    for i, part in enumerate(rest):
        if not isinstance(value, Mapping):
            raise ExpressionError(f"{'.'.join([head, *rest[:i]])} has no property {part!r} (in {text!r})")
        if part not in value:
            # GitHub gives null for a missing step output or env var; anything else is a mistake here.
            if head == "env" or (head == "steps" and i == 2 and rest[1] == "outputs"):
                return None
            raise ExpressionError(f"{'.'.join([head, *rest[: i + 1]])} is not defined (in {text!r})")
        value = value[part]
    return value


def _truthy(value: Any) -> bool:
    return value not in (None, False, "", 0, 0.0)


def _equal(left: Any, right: Any) -> bool:
    # GitHub compares strings case-insensitively; null and '' are both empty here.
    left, right = ("" if left is None else left), ("" if right is None else right)
    if isinstance(left, str) and isinstance(right, str):
        return left.casefold() == right.casefold()
    if type(left) is not type(right):
        raise ExpressionError(f"comparing {left!r} with {right!r}: mixed types are not supported here")
    return bool(left == right)


def evaluate(text: str, context: Mapping[str, Any]) -> Any:
    """Evaluate an expression (with or without ``${{ }}`` around it, as in ``if:``)."""
    text = text.strip()
    match = re.fullmatch(r"\$\{\{(.*)\}\}", text, re.S)
    return _Parser(match.group(1) if match else text, context).parse()


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else str(value)
    if isinstance(value, str):
        return value
    raise ExpressionError(f"cannot interpolate {value!r}")


def render(value: Any, context: Mapping[str, Any]) -> str:
    """Replace every ``${{ expr }}`` in a string (numbers and booleans from YAML become text)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return str(value)
    if not isinstance(value, str):
        raise ExpressionError(f"cannot render {value!r}")
    return re.sub(r"\$\{\{(.*?)\}\}", lambda m: _as_text(_Parser(m.group(1), context).parse()), value)


# ---- runner files and workflow commands


def parse_vars(text: str) -> dict[str, str]:
    """Parse a GITHUB_ENV / GITHUB_OUTPUT file: ``NAME=value`` lines and ``NAME<<DELIMITER`` blocks."""
    values: dict[str, str] = {}
    lines = iter(text.splitlines())
    for line in lines:
        if not line:
            continue
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            body: list[str] = []
            for item in lines:
                if item == delimiter:
                    break
                body.append(item)
            else:
                raise ValueError(f"{name}: no closing {delimiter!r} in a runner file")
            values[name] = "\n".join(body)
        elif "=" in line:
            name, value = line.split("=", 1)
            values[name] = value
        else:
            raise ValueError(f"malformed line in a runner file: {line!r}")
    return values


_COMMAND = re.compile(r"^::(?P<name>[a-z-]+)(?: (?P<props>[^:]*))?::(?P<message>.*)$")


def _commands(stdout: str) -> list[tuple[str, str]]:
    found = []
    for line in stdout.splitlines():
        match = _COMMAND.match(line)
        if match:
            message = match["message"].replace("%0A", "\n").replace("%0D", "\r").replace("%25", "%")
            found.append((match["name"], message))
    return found


# ---- actions/cache


@dataclass
class CacheEntry:
    key: str
    version: str
    ref: str
    seq: int
    members: list[tuple[str, Path]]  # (the absolute path it was saved from and is restored to, the copy)


class FakeActionsCache:
    """The GitHub Actions cache of one repository, as ``actions/cache@v4`` sees it, on directories."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.entries: list[CacheEntry] = []
        self._seq = itertools.count()

    @staticmethod
    def version(paths: list[str]) -> str:
        # actions/cache mixes the path list (and the compression method) into the entry's version.
        return hashlib.sha256("|".join([*paths, "zstd-without-long", "1.0"]).encode()).hexdigest()

    def keys(self) -> list[str]:
        return [entry.key for entry in self.entries]

    def find(self, paths: list[str], key: str, restore_keys: list[str], ref: str) -> CacheEntry | None:
        version = self.version(paths)
        visible = [e for e in self.entries if e.version == version and e.ref in (ref, DEFAULT_REF)]
        # The job's own ref first, then the default branch; newest first within each.
        visible.sort(key=lambda e: (e.ref == ref, e.seq), reverse=True)
        for entry in visible:
            if entry.key == key:
                return entry
        for prefix in restore_keys:
            for entry in visible:
                if entry.key.startswith(prefix):
                    return entry
        return None

    def restore(self, paths: list[str], key: str, restore_keys: list[str], ref: str) -> str | None:
        """Like extracting the entry's tar: every member back to the absolute path it was saved from."""
        entry = self.find(paths, key, restore_keys, ref)
        if entry is None:
            return None
        for original, stored in entry.members:
            if stored.is_dir():
                shutil.copytree(stored, original, dirs_exist_ok=True)
            else:
                Path(original).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(stored, original)
        return entry.key

    def save(self, paths: list[str], key: str, ref: str) -> str:
        """Save what ``paths`` (directories, files or glob patterns) match under ``key``.

        Returns what actions/cache logs: ``[warning]...`` lines are ``core.info`` there, not annotations.
        """
        version = self.version(paths)
        if any(e.key == key and e.version == version and e.ref == ref for e in self.entries):
            return (f"[warning]Failed to save: Unable to reserve cache with key {key}, another job may be "
                    "creating this cache.")
        matched = sorted({found for pattern in paths for found in glob.glob(pattern)})
        if not matched:
            return ("[warning]Path Validation Error: Path(s) specified in the action for caching do(es) not exist, "
                    "hence no cache is being saved.")
        content = self.root / f"entry-{len(self.entries)}"
        content.mkdir(parents=True)
        members = []
        for index, path in enumerate(matched):
            stored = content / str(index)
            if os.path.isdir(path):
                shutil.copytree(path, stored)
            else:
                shutil.copy2(path, stored)
            members.append((path, stored))
        self.entries.append(CacheEntry(key=key, version=version, ref=ref, seq=next(self._seq), members=members))
        return f"Cache saved with key: {key}"


def _lines(value: str) -> list[str]:
    return [line.strip() for line in value.splitlines() if line.strip()]


# ---- the job


@dataclass
class StepResult:
    name: str
    outcome: str  # success, failure or skipped
    returncode: int = 0
    stdout: str = ""
    outputs: dict[str, str] = field(default_factory=dict)
    commands: list[tuple[str, str]] = field(default_factory=list)


_CACHE_INPUTS = {
    "actions/cache@v4": {"path", "key", "restore-keys"},
    "actions/cache/restore@v4": {"path", "key", "restore-keys"},
    "actions/cache/save@v4": {"path", "key"},
}
# Variables of this (outer) test session that must not leak into the simulated job.
_LEAKY = ("GITHUB_", "RUNNER_", "INPUT_", "PYTEST_", "TORCHINDUCTOR_", "TRITON_", "COMPILECACHE_")


class Job:
    """One job on a fresh runner. ``temp`` is RUNNER_TEMP: the same path every job, emptied at the start."""

    def __init__(
        self,
        *,
        root: Path,
        cache: FakeActionsCache,
        event: str,
        run_id: int,
        run_attempt: int = 1,
        ref: str | None = None,
        workspace: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.cache = cache
        self.event = event
        self.ref = ref or ("refs/pull/1/merge" if event.startswith("pull_request") else DEFAULT_REF)
        self.workspace = workspace
        self.temp = root / "runner-temp"
        shutil.rmtree(self.temp, ignore_errors=True)
        self.temp.mkdir(parents=True)
        self.files = root / f"runner-files-{run_id}-{run_attempt}"
        shutil.rmtree(self.files, ignore_errors=True)
        self.files.mkdir(parents=True)
        self.github = {
            "event_name": event,
            "run_id": str(run_id),
            "run_attempt": str(run_attempt),
            "ref": self.ref,
            "workspace": str(workspace),
        }
        base = {k: v for k, v in os.environ.items() if not k.startswith(_LEAKY)}
        base.update(env or {})
        base.update(
            CI="true",
            GITHUB_ACTIONS="true",
            GITHUB_EVENT_NAME=event,
            GITHUB_RUN_ID=str(run_id),
            GITHUB_RUN_ATTEMPT=str(run_attempt),
            GITHUB_REF=self.ref,
            GITHUB_WORKSPACE=str(workspace),
            RUNNER_TEMP=str(self.temp),
        )
        self.base_env = base
        self.job_env: dict[str, str] = {}  # what steps wrote to GITHUB_ENV
        self.steps: list[StepResult] = []
        self.summary = ""
        self.failed = False
        self._post: list[tuple[str, Callable[[], StepResult]]] = []
        self._counter = itertools.count()

    # -- steps

    def env(self) -> dict[str, str]:
        return {**self.base_env, **self.job_env}

    def run(self, script: str, *, name: str = "run", env: Mapping[str, str] | None = None,
            cwd: Path | None = None, continue_on_error: bool = False, timeout: float = 600) -> StepResult:
        """A workflow's own ``run:`` step (``shell: bash``); a failure fails the job unless continue_on_error."""
        result = self._script(script, name=name, env=env, cwd=cwd, timeout=timeout)
        if result.outcome == "failure" and not continue_on_error:
            self.failed = True
        return result

    def _script(self, script: str, *, name: str, env: Mapping[str, str] | None = None, cwd: Path | None = None,
                action_path: Path | None = None, timeout: float = 600) -> StepResult:
        n = next(self._counter)
        files = {kind: self.files / f"{n}-{kind}" for kind in ("env", "output", "summary")}
        for path in files.values():
            path.write_text("")
        step_env = {**self.env(), **(env or {})}
        step_env.update(
            GITHUB_ENV=str(files["env"]), GITHUB_OUTPUT=str(files["output"]),
            GITHUB_STEP_SUMMARY=str(files["summary"]),
        )
        if action_path is not None:
            step_env["GITHUB_ACTION_PATH"] = str(action_path)
        script_file = self.files / f"{n}-script.sh"
        script_file.write_text(script)
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script_file)],
            env=step_env, cwd=cwd or self.workspace, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, timeout=timeout, check=False,
        )
        self.job_env.update(parse_vars(files["env"].read_text()))
        self.summary += files["summary"].read_text()
        result = StepResult(
            name=name, outcome="success" if proc.returncode == 0 else "failure", returncode=proc.returncode,
            stdout=proc.stdout, outputs=parse_vars(files["output"].read_text()), commands=_commands(proc.stdout),
        )
        self.steps.append(result)
        return result

    def use(self, action: str, with_: Mapping[str, Any], *, name: str | None = None) -> StepResult:
        """A ``uses:`` step: a local composite action (a path), or one of the fake actions/cache actions."""
        if action in _CACHE_INPUTS:
            return self._cache_action(action, {k: render(v, {}) for k, v in with_.items()}, name or action)
        return self._composite(Path(action), with_, name or action)

    def finish(self) -> list[StepResult]:
        """Job end: the post steps, last registered first (each checks its own post-if)."""
        results = [post() for _, post in reversed(self._post)]
        self._post.clear()
        self.steps.extend(results)
        return results

    def warnings(self) -> list[str]:
        return [message for step in self.steps for kind, message in step.commands if kind in ("warning", "error")]

    # -- composite actions

    def _composite(self, action_dir: Path, with_: Mapping[str, Any], name: str) -> StepResult:
        metadata = yaml.safe_load((action_dir / "action.yml").read_text())
        if metadata["runs"]["using"] != "composite":
            raise ExpressionError(f"{action_dir}: only composite actions are supported")
        declared = metadata.get("inputs") or {}
        unknown = set(with_) - set(declared)
        if unknown:
            raise ExpressionError(f"{name}: unexpected inputs {sorted(unknown)}")
        inputs = {k: render(spec.get("default", ""), {}) for k, spec in declared.items()}
        inputs.update({k: render(v, {}) for k, v in with_.items()})
        steps: dict[str, Any] = {}
        failed = False
        for index, step in enumerate(metadata["runs"]["steps"]):
            label = step.get("name") or step.get("id") or f"step {index}"

            def status(function: str, failed: bool = failed) -> bool:
                return {"success": not failed and not self.failed, "always": True,
                        "failure": failed or self.failed}[function]

            context = {
                "inputs": inputs, "steps": steps, "github": {**self.github, "action_path": str(action_dir)},
                "runner": {"temp": str(self.temp)}, "env": self.env(), "__status__": status,
            }
            condition = step.get("if", "success()")
            if not _truthy(evaluate(str(condition), context)):
                result = StepResult(name=label, outcome="skipped")
                self.steps.append(result)
            elif "run" in step:
                if step.get("shell") != "bash":
                    raise ExpressionError(f"{label}: only shell: bash is supported")
                env = {k: render(v, context) for k, v in (step.get("env") or {}).items()}
                result = self._script(render(step["run"], context), name=label, env=env, action_path=action_dir)
            else:
                uses = step["uses"]
                if uses not in _CACHE_INPUTS:
                    raise ExpressionError(f"{label}: uses {uses!r} is not simulated")
                values = {k: render(v, context) for k, v in (step.get("with") or {}).items()}
                result = self._cache_action(uses, values, label)
            raw = step.get("continue-on-error", False)
            continue_on_error = raw if isinstance(raw, bool) else _truthy(evaluate(str(raw), context))
            if result.outcome == "failure" and not continue_on_error:
                failed = True
            if "id" in step:
                steps[step["id"]] = {"outputs": result.outputs, "outcome": result.outcome,
                                     "conclusion": "success" if continue_on_error else result.outcome}
        context = {"steps": steps, "inputs": inputs, "github": self.github, "runner": {"temp": str(self.temp)},
                   "env": self.env(), "__status__": lambda function: not failed}
        outputs = {k: render(spec["value"], context) for k, spec in (metadata.get("outputs") or {}).items()}
        if failed:
            self.failed = True
        return StepResult(name=name, outcome="failure" if failed else "success", outputs=outputs)

    # -- actions/cache

    def _cache_action(self, uses: str, values: Mapping[str, str], name: str) -> StepResult:
        unknown = set(values) - _CACHE_INPUTS[uses]
        if unknown:
            raise ExpressionError(f"{name}: inputs {sorted(unknown)} are not simulated for {uses}")
        paths, key = _lines(values["path"]), values["key"]
        if uses == "actions/cache/save@v4":
            log = self.cache.save(paths, key, self.ref)
            result = StepResult(name=name, outcome="success", stdout=log)
            self.steps.append(result)
            return result
        restore_keys = _lines(values.get("restore-keys", ""))
        try:
            matched = self.cache.restore(paths, key, restore_keys, self.ref)
        except Exception as exc:  # the action's step fails, as a JavaScript action that throws does
            result = StepResult(name=name, outcome="failure", returncode=1, stdout=f"::error::{exc}",
                                commands=[("error", str(exc))])
            self.steps.append(result)
            return result
        exact = matched == key
        outputs = {"cache-hit": str(exact).lower()}
        if uses == "actions/cache/restore@v4":
            outputs.update({"cache-primary-key": key, "cache-matched-key": matched or ""})
        else:
            def post(paths: list[str] = paths, key: str = key, exact: bool = exact) -> StepResult:
                if self.failed:  # post-if: success()
                    return StepResult(name=f"Post {name}", outcome="skipped")
                if exact:
                    log = f"Cache hit occurred on the primary key {key}, not saving cache."
                else:
                    log = self.cache.save(paths, key, self.ref)
                return StepResult(name=f"Post {name}", outcome="success", stdout=log)

            self._post.append((name, post))
        log = f"Cache restored from key: {matched}" if matched else f"Cache not found for input keys: {key}"
        result = StepResult(name=name, outcome="success", stdout=log, outputs=outputs)
        self.steps.append(result)
        return result
