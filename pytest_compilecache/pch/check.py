"""Which headers a session used and may carry: the compiler's check of a header under torch's own flags
(:func:`check`), what each process reports of it (:class:`HeaderUse`), and the headers found from those
reports (:func:`find_used`) or, without any, from their times (:func:`find_built`).
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Iterable
from typing import Mapping
from typing import Sequence

from .._fs import temporary_dir
from ..errors import HeaderError
from .locks import being_built
from .locks import build_lock
from .names import CHECK_TIMEOUT
from .names import header_dir
from .names import is_header_name
from .names import looks_complete
from .verdicts import _one_check_at_a_time
from .verdicts import _Verdicts
from .verdicts import forget

OK_VERDICTS = ("verified", "rebuilt")
""":attr:`HeaderUse.verdict` values of a header the compiler accepted (checked, or built again after failing)."""


def check(
    path: Path,
    command: Callable[[Path, Path], Sequence[str]],
    timeout: float = CHECK_TIMEOUT,
    *,
    remember: bool = False,
) -> str | None:
    """Compile a one-line file with ``-include`` of the header at ``path``; None when the compiler accepted
    it, else the compiler's first line about it.

    ``command(source, include)`` gives the argv that compiles ``source`` with ``-include <include>`` under the
    flags torch uses with this header (:func:`.probe.watch_precompiled_headers` builds it from torch's own
    command line); ``-fsyntax-only -Winvalid-pch`` are added. ``include`` is a name in a private temp dir
    whose ``.gch``/``.pch`` is a link to ``path`` and whose text header does not exist: a PCH the compiler
    will not use (not a PCH, other flags) cannot fall back to parsing text, so every rejection is an error,
    and so is a truncated file ("cannot read PCH file") or an internal compiler error. Raises HeaderError
    (one line) when the check could not run at all (no compiler, a timeout): that proves nothing either way.

    ``remember``: use the header dir's record of accepted headers (:data:`VERDICTS`). A header the
    record says this very file was accepted by this very check (same argv, same compiler binary) is accepted
    without running the compiler; an acceptance is added to the record. Rejections are never remembered.
    Processes that check the same file at once (xdist workers meeting a header just restored) take turns
    (a lock on the header file itself), so the later ones find the first one's verdict instead of running
    the compiler again.
    """
    with temporary_dir("tmp") as tmp:  # ours by name: a killed check's dir is swept like our other temp dirs
        include = Path(tmp) / "compilecache_check.h"
        os.symlink(os.path.abspath(path), str(include) + path.suffix)
        source = Path(tmp) / "compilecache_check.cpp"
        source.write_text("int compilecache_check_pch;\n")
        argv = [*command(source, include), "-fsyntax-only", "-Winvalid-pch"]
        record = _Verdicts.of(path, argv, tmp) if remember else None
        with _one_check_at_a_time(path if record is not None else None):
            if record is not None and record.accepted():
                return None
            try:
                done = subprocess.run(
                    argv, cwd=tmp, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False
                )
            except subprocess.TimeoutExpired:
                raise HeaderError(f"the compiler did not finish checking {path.name} in {timeout:g} s") from None
            except OSError as exc:
                raise HeaderError(f"cannot run {argv[0]} to check {path.name}: {exc.strerror or exc}") from None
            if done.returncode == 0 and record is not None:
                record.add()  # before the next process in line reads the record
    if done.returncode == 0:
        return None
    text = done.stderr.decode("utf-8", "replace").replace(str(include) + path.suffix, path.name)
    text = text.replace(str(include), path.name[: -len(path.suffix)]).replace(tmp + os.sep, "")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # The line naming the header (gcc's reason for not using it), else the fatal one (a truncated file, an
    # internal compiler error), else the first.
    for marks in ((path.name,), ("internal compiler error", "fatal error"), ("",)):
        picked = next((line for line in lines if any(mark in line for mark in marks)), None)
        if picked is not None:
            return picked[:200]
    return f"exit status {done.returncode}"


def remove_if_unchanged(path: Path, info: os.stat_result) -> bool:
    """Remove the header at ``path`` when it is still the file ``info`` (an lstat) describes; True if removed.

    For a header the compiler rejected: torch then builds it again (it builds whenever the file is absent).
    Taken under torch's own build lock, without waiting: False, nothing removed, when torch holds it (it is
    building that very file) or the file was replaced since (another process repaired it already).
    """
    directory = path.parent
    if not is_header_name(path.name):
        return False
    with build_lock(directory, path.name) as held:
        if not held:
            return False
        try:
            now = os.lstat(path)
        except OSError:
            return False
        if not stat.S_ISREG(now.st_mode) or (now.st_size, now.st_mtime_ns, now.st_ino) != (
            info.st_size,
            info.st_mtime_ns,
            info.st_ino,
        ):
            return False
        os.unlink(path)
        return True


@dataclass(frozen=True)
class HeaderUse:
    """One header a process of this session looked up through torch, as that process reports it (plain JSON
    in the xdist worker payload).

    ``verdict``: ``verified`` (the compiler accepted it), ``rebuilt`` (it failed the check, was removed and
    torch built it again, which then passed), ``damaged`` (it failed and could not be replaced) or
    ``unchecked`` (the check could not run: no compiler, a timeout). ``size``, ``mtime_ns`` and ``ino``
    identify the file the verdict is about: a save carries it only while the file is still that one.
    ``note``: one line for the session's notes, or empty.
    """

    name: str
    verdict: str
    size: int = 0
    mtime_ns: int = 0
    ino: int = 0
    note: str = ""

    @property
    def accepted(self) -> bool:
        return self.verdict in OK_VERDICTS

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "size": self.size,
            "mtime_ns": self.mtime_ns,
            "ino": self.ino,
            "note": self.note,
        }

    @classmethod
    def from_json(cls, data: object) -> HeaderUse | None:
        """The report, or None for anything malformed (a worker's payload is ours, but never trusted blindly)."""
        if not isinstance(data, Mapping):
            return None
        name, verdict, note = data.get("name"), data.get("verdict"), data.get("note", "")
        numbers = [data.get(key, 0) for key in ("size", "mtime_ns", "ino")]
        if not isinstance(name, str) or not is_header_name(name) or not isinstance(verdict, str):
            return None
        if verdict not in (*OK_VERDICTS, "damaged", "unchecked") or not isinstance(note, str):
            return None
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers):
            return None
        size, mtime_ns, ino = numbers
        return cls(name, verdict, size, mtime_ns, ino, note.splitlines()[0][:300] if note else "")

    def matches(self, info: os.stat_result) -> bool:
        """True when ``info`` (an lstat) is the very file this verdict is about."""
        return (info.st_size, info.st_mtime_ns, info.st_ino) == (self.size, self.mtime_ns, self.ino)


def header_uses(reports: Iterable[object]) -> list[HeaderUse]:
    """The valid :class:`HeaderUse` reports among ``reports`` (JSON dicts from every process), malformed ones
    dropped."""
    return [use for use in map(HeaderUse.from_json, reports) if use is not None]


def header_notes(reports: Iterable[object]) -> list[str]:
    """One note per header that some process found damaged (removed and rebuilt, or left) or could not
    check, in name order: xdist workers that met the same header say so once."""
    notes: dict[str, str] = {}
    for use in header_uses(reports):
        if use.note and use.name not in notes:
            notes[use.name] = use.note
    return [notes[name] for name in sorted(notes)]


def find_used(directory: Path, uses: Iterable[object], installed: Iterable[str] = ()) -> list[Path]:
    """The compiled headers in ``directory`` this session used and may carry, sorted by name.

    ``uses``: the :class:`HeaderUse` reports (JSON) of every process of the session. A header counts when some
    process's compiler check accepted it and the file is still the one it checked (same size, mtime, inode),
    or when this session's restore installed or found it (``installed``: names; the bytes were checked
    against a verified manifest, and no kernel may have needed it) and no process reported it other than
    accepted (damaged, or not checked: never named again). Nothing here reads access times.

    Skipped: symlinks, names that are not torch's, empty files, headers whose build lock another process holds
    right now (torch is writing it in place), and a reported header that changed since its check. A missing
    dir is an empty list.
    """
    if os.name == "nt":  # torch precompiles no header on Windows (codecache asserts it)
        return []
    accepted: dict[str, list[HeaderUse]] = {}
    refused: set[str] = set()
    for use in header_uses(uses):
        if use.accepted:
            accepted.setdefault(use.name, []).append(use)
        else:
            refused.add(use.name)
    keep = set(installed) - refused  # installed, then found damaged or not checked here: not named again
    found: list[Path] = []
    for name in sorted(set(accepted) | {name for name in keep if is_header_name(name)}):
        path = Path(directory) / name
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
            continue
        if name not in keep and not any(use.matches(info) for use in accepted[name]):
            continue  # replaced since every check of it: not the file the compiler accepted
        if not being_built(Path(directory), name):
            found.append(path)
    return found


def find_built(directory: Path, since: float) -> list[Path]:
    """Headers whose file was written since ``since`` (mtime: recorded on every mount), for a save with no
    process reports (the CLI's ``--headers-since``); ``since=0`` takes every header. Same skips as
    :func:`find_used`, plus files that do not start like a PCH (:func:`looks_complete` is all such a save can
    check: it has no compiler flags)."""
    if os.name == "nt":
        return []
    try:
        names = sorted(entry.name for entry in os.scandir(directory) if is_header_name(entry.name))
    except OSError:
        return []
    found: list[Path] = []
    for name in names:
        path = Path(directory) / name
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0 or info.st_mtime < since:
            continue
        if looks_complete(path) and not being_built(Path(directory), name):
            found.append(path)
    return found


# What a compiler says when it cannot use a PCH it was given: gcc's "while reading precompiled header", "cannot
# read PCH file", "one or more PCH files were found, but they were invalid"; clang's "PCH file ... corrupt".
# Never a flag or a file name of torch's command (clang's ``-Xclang -fno-validate-pch``, ``x.h.pch``), which
# every failed compile's text repeats.
_PCH_TROUBLE = r"precompiled header|(?<![-.\w/])PCH\b"
# torch's header names in a compile command (``-include <dir>/<hash>.h``) or a compiler's output (``<hash>.h.gch``).
_NAMED = r"(c[a-z2-7]{51})\.h\b"


def after_compile_error(text: str, directory: Path | None = None) -> list[HeaderUse]:
    """A kernel compile failed with ``text`` (torch's ``CppCompileError``: the command, then the compiler's
    output): when the compiler complains about a precompiled header, each of torch's headers in ``directory``
    (default: torch's) that the text names loses its verdict (:data:`.verdicts.VERDICTS`: its next look-up
    checks it again) and is removed under torch's build lock (a later compile of this process then parses
    the text header, as the compiler does without a PCH, and the next process's torch builds it again).
    Returns each such header's report (:class:`HeaderUse`, ``unchecked``: never carried, with its note). Never
    raises; a text that names no header, or whose compiler did not
    complain about one, changes nothing."""
    if not re.search(_PCH_TROUBLE, text, re.IGNORECASE):
        return []
    target = directory or header_dir()
    complaint = next((line.strip() for line in text.splitlines() if re.search(_PCH_TROUBLE, line, re.I)), "")
    notes: list[HeaderUse] = []
    for stem in sorted(set(re.findall(_NAMED, text))):
        for suffix in (".gch", ".pch"):
            path = target / f"{stem}.h{suffix}"
            use = _drop(path, f"precompiled header {path.name} made a kernel compile fail ({complaint[:200]})")
            if use is not None:
                notes.append(use)
    return notes


def _compiles(argv: Sequence[str], cwd: str) -> bool:
    return (
        subprocess.run(
            argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=CHECK_TIMEOUT
        ).returncode
        == 0
    )


def _drop(path: Path, what: str) -> HeaderUse | None:
    """A compiled header that made a kernel compile fail: it loses its verdict and is removed under torch's
    build lock; its report (``unchecked``: never carried) says ``what`` happened and what became of it. None
    when ``path`` is not a regular file (or cannot be read)."""
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode):
            return None
        forget(path.parent, path.name)
        removed = remove_if_unchanged(path, info)
    except (OSError, HeaderError):
        return None
    note = f"{what}; removed it: torch builds it again" if removed else f"{what}; it is checked again"
    return HeaderUse(path.name, "unchecked", note=note)


def after_silent_compile_error(command: Sequence[str], directory: Path | None = None) -> list[HeaderUse]:
    """A kernel compile (``command``, torch's argv) failed and its compiler said nothing of a precompiled header
    (:func:`after_compile_error` found no complaint): when the command includes one of torch's headers in
    ``directory`` (default: torch's) that has a compiled file, it runs again (its output in a temp dir): once as
    it was, then with the text header alone (a copy in that dir, no compiled file beside it). When the first
    fails again and the second succeeds, the compiled header made the compile fail (a failure that passes, a
    compiler killed for memory, blames nothing): damaged deeper than :func:`check`'s one-line compile reads (an internal
    compiler error, or C++ errors, where the kernel uses what is damaged), or built from another text. It then
    loses its verdict and is removed, as :func:`after_compile_error` does; a compile that fails without it too
    changes nothing. Returns each such header's report (``unchecked``: never carried). Never raises."""
    target = directory or header_dir()
    argv = list(command)
    notes: list[HeaderUse] = []
    for at in [i + 1 for i, arg in enumerate(argv[:-1]) if arg == "-include"]:
        include = Path(argv[at])
        compiled = [include.with_name(include.name + suffix) for suffix in (".gch", ".pch")]
        compiled = [path for path in compiled if path.parent == target and path.is_file()]
        if not re.fullmatch(_NAMED, include.name) or not compiled or "-o" not in argv[:-1]:
            continue
        try:
            with temporary_dir("tmp") as tmp:
                again = list(argv)
                again[again.index("-o") + 1] = str(Path(tmp) / "kernel")
                if _compiles(again, tmp):
                    continue  # it compiles now, header and all: the failure passed (memory, a full disk, a kill)
                alone = Path(tmp) / include.name
                alone.write_bytes(include.read_bytes())
                again[at] = str(alone)
                if not _compiles(again, tmp):
                    continue  # it fails without the compiled header too: not the header's doing
        except (OSError, subprocess.SubprocessError):
            continue
        for path in compiled:
            use = _drop(path, f"precompiled header {path.name} made a kernel compile fail that succeeds without it")
            if use is not None:
                notes.append(use)
    return notes
