"""torch's precompiled C++ headers as this process uses them: each one checked at its first look-up.

Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``..pch``,
``threading``, ``shlex``, ``torch._inductor.cpp_builder``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from pathlib import Path
from typing import Any
from typing import Iterable

from .hooks import CODECACHE
from .hooks import install_now_or_on_import

# --------------------------------------------------------------------------- precompiled headers


def precompiled_header_dir() -> str | None:
    """torch's precompiled-header dir in this process, or None where this torch has none (2.7) or is not loaded.

    Reads ``torch._inductor.codecache._HEADER_DIR`` (2.8-2.15) only when torch already imported that module, so
    it never costs an import. ``headers.header_dir()`` computes the same path without torch; call this at
    session end, in each process that compiled, to check that the two agree before carrying headers (a
    mismatch means a torch that moved the dir: carry nothing rather than the wrong files).
    """
    codecache = sys.modules.get("torch._inductor.codecache")
    if codecache is None or not callable(getattr(codecache, "_precompile_header", None)):
        return None
    directory = getattr(codecache, "_HEADER_DIR", None)
    return directory if isinstance(directory, str) else None


_header_watch: str | None = None  # None: not tried yet; "" installed; otherwise why not
_header_uses: dict[str, dict[str, Any]] = {}  # header name -> its HeaderUse JSON, for this process
_early_checks: list[Path] = []  # headers this process's restore installs, to check early (check_headers_early)


def watch_precompiled_headers() -> None:
    """From now on, check every precompiled header torch looks up in this process before a kernel uses it,
    and remember it for :func:`precompiled_headers_used`; never imports torch.

    Call once per process (the plugin's configure step, in every xdist worker). Installs now when torch's
    codecache is already imported, else as soon as it is. See :mod:`.headers` for why.
    """
    install_now_or_on_import(CODECACHE, _install_header_watch, pending=_header_watch is None)


def precompiled_headers_used() -> list[dict[str, Any]]:
    """The headers torch looked up in this process so far, each checked once (``headers.HeaderUse`` JSON)."""
    return [dict(use) for use in _header_uses.values()]


def check_headers_early(names: Iterable[str], directory: Path | None = None) -> None:
    """Headers a restore is installing (or installed) for this process: their compiled ``.gch``/``.pch``
    names, in ``directory`` (default: torch's header dir for this process, :func:`.headers.header_dir`).

    At torch's first header look-up in this process they are checked in a thread, under the flags of that
    look-up, while torch works out which header it wants (it preprocesses the header and hashes the result:
    about as long as the check), and each acceptance goes into the header dir's record
    (:data:`.headers.VERDICTS`). The look-up's own check, after torch has answered, then finds the verdict (or
    waits for it: checks of one file take turns) instead of running the compiler on the critical path. A
    rejection is not remembered, so a damaged header is still found, removed and rebuilt by that check.
    Never imports torch; a name torch could not give a header is ignored."""
    from .. import pch as headers

    target = directory or headers.header_dir()
    _early_checks[:] = [target / name for name in names if headers.is_header_name(name)]


def _start_early_checks(compile_command: dict[str, Any]) -> None:
    """Check the headers :func:`check_headers_early` named, in a thread, each once installed (best effort)."""
    import threading

    paths = list(_early_checks)
    _early_checks.clear()

    def run() -> None:
        from .. import pch as headers

        def command(source: Path, include: Path) -> list[str]:
            return _header_check_command(compile_command, str(source), str(include))

        for path in paths:
            with contextlib.suppress(Exception):  # advisory: the look-up's own check decides
                if headers.wait_while_built(path) and path.name not in _header_uses:
                    headers.check(path, command, remember=True)

    threading.Thread(target=run, name="compilecache-header-check", daemon=True).start()


def _install_header_watch() -> None:
    """Wrap ``codecache._precompile_header(header, hashable_cmd_line, **compile_command) -> path`` (2.8-2.15).

    torch calls it, by its module-global name, from ``CppCodeCache.load_async`` for every kernel key not yet
    loaded in this process and uses the returned ``<dir>/<hash>.h`` with ``-include``; it is a
    ``functools.cache``, and builds the header only when the compiled file is absent. The wrapper returns
    torch's answer unchanged, after the first look-up of each header in this process has checked it.
    """
    global _header_watch
    if _header_watch is not None:
        return
    codecache = sys.modules.get(CODECACHE)
    original = getattr(codecache, "_precompile_header", None)
    if codecache is None or not callable(original) or not callable(getattr(original, "__wrapped__", None)):
        _header_watch = "this torch precompiles no header"  # 2.7: nothing to check or carry
        return

    def _precompile_header(header: Any, hashable_cmd_line: Any, **compile_command: Any) -> Any:
        if _early_checks:  # torch pops from compile_command: the thread gets its own copy
            with contextlib.suppress(Exception):
                _start_early_checks(dict(compile_command))
        path = original(header, hashable_cmd_line, **compile_command)
        with contextlib.suppress(Exception):  # a failure of ours never fails torch's compile
            _check_header(
                path, lambda: original.__wrapped__(header, hashable_cmd_line, **compile_command), compile_command
            )
        return path

    _precompile_header.__wrapped__ = original  # type: ignore[attr-defined]
    for name in ("cache_info", "cache_clear"):  # still torch's functools.cache to anyone who asks
        if hasattr(original, name):
            setattr(_precompile_header, name, getattr(original, name))
    setattr(codecache, "_precompile_header", _precompile_header)  # noqa: B010 (a module typed as ModuleType)
    compile_cpp = getattr(codecache, "_worker_compile_cpp", None)
    if callable(compile_cpp) and getattr(compile_cpp, "__wrapped__", None) is None:
        _worker_compile_cpp.__wrapped__ = compile_cpp  # type: ignore[attr-defined]
        setattr(codecache, "_worker_compile_cpp", _worker_compile_cpp)  # noqa: B010
    _header_watch = ""


def _worker_compile_cpp(lock_path: str, cpp_builders: Any) -> None:
    """torch's ``codecache._worker_compile_cpp(lock_path, cpp_builders)`` (2.8-2.15), which builds a kernel in
    this process or in a compile worker (this function is pickled there by name): a failure whose compiler
    complains about a precompiled header it names drops that header's verdict and removes it
    (:func:`..pch.after_compile_error`), so that the next look-up checks it and torch builds it again; so does
    a failure that says nothing of it but goes away without it (:func:`..pch.after_silent_compile_error`)."""
    codecache = sys.modules.get(CODECACHE) or importlib.import_module(CODECACHE)
    current = getattr(codecache, "_worker_compile_cpp", None)
    original = getattr(current, "__wrapped__", current)  # a compile worker: torch's own, never wrapped there
    try:
        original(lock_path, cpp_builders)  # type: ignore[misc]
    except Exception as exc:
        with contextlib.suppress(Exception):  # a failure of ours never hides torch's
            from .. import pch

            where = precompiled_header_dir()
            directory = Path(where) if where else None
            uses = pch.after_compile_error(str(exc), directory)
            if not uses:  # the compiler said nothing of a header: one that used one runs again without it
                import shlex

                for builder in cpp_builders:
                    uses += pch.after_silent_compile_error(shlex.split(builder.get_command_line()), directory)
            for use in uses:
                _header_uses[use.name] = use.to_json()
        raise


def uninstall_header_watch() -> None:
    """Put torch's own ``_precompile_header`` back and forget what was recorded (tests)."""
    global _header_watch
    codecache = sys.modules.get(CODECACHE)
    original = getattr(getattr(codecache, "_precompile_header", None), "__wrapped__", None)
    if codecache is not None and original is not None and getattr(original, "__wrapped__", None) is not None:
        setattr(codecache, "_precompile_header", original)  # noqa: B010
    compile_cpp = getattr(getattr(codecache, "_worker_compile_cpp", None), "__wrapped__", None)
    if codecache is not None and compile_cpp is not None:
        setattr(codecache, "_worker_compile_cpp", compile_cpp)  # noqa: B010
    _header_watch = None
    _header_uses.clear()
    _early_checks.clear()


def _compiled_header(path: str) -> Path | None:
    """The compiled file beside torch's ``<hash>.h``: ``.gch`` (gcc) or ``.pch`` (clang), whichever exists."""
    for suffix in (".gch", ".pch"):
        candidate = Path(path + suffix)
        if candidate.is_file() and not candidate.is_symlink():
            return candidate
    return None


def _check_header(path: Any, rebuild: Any, compile_command: dict[str, Any]) -> None:
    """Check the header at ``path`` once per process (and once per file across processes: a file the
    compiler accepted before, unchanged, is not compiled against again, ``headers.VERDICTS``); when the
    compiler rejects it, remove it and have torch build it again (``rebuild``: torch's uncached
    ``_precompile_header``), then check that one."""
    from .. import pch as headers

    compiled = _compiled_header(str(path)) if isinstance(path, str) else None
    if compiled is None or compiled.name in _header_uses:
        return

    def command(source: Path, include: Path) -> list[str]:
        return _header_check_command(compile_command, str(source), str(include))

    def verdict() -> tuple[str | None, os.stat_result]:
        info = os.lstat(compiled)
        return headers.check(compiled, command, remember=True), info  # an accepted file is checked once

    name = compiled.name
    try:
        reason, info = verdict()
    except Exception as exc:  # no compiler, a timeout, a torch whose builder API moved: proves nothing
        _header_uses[name] = {
            "name": name,
            "verdict": "unchecked",
            "note": f"precompiled header {name} not checked (so not carried): {exc}",
        }
        return
    if reason is None:
        _header_uses[name] = _use(name, "verified", info)
        return
    what = f"precompiled header {name} rejected by the compiler ({reason})"
    if not headers.remove_if_unchanged(compiled, info):
        _header_uses[name] = _use(name, "damaged", info, f"{what}; could not remove it (torch holds its lock)")
        return
    try:
        rebuild()
        again, info = verdict()
    except Exception as exc:  # torch's build failed, or the check could not run: nothing to carry
        note = f"{what}; removed it, then: {type(exc).__name__}: {exc}"
        _header_uses[name] = {"name": name, "verdict": "unchecked", "note": note}
        return
    if again is None:
        _header_uses[name] = _use(name, "rebuilt", info, f"{what}; removed it and torch built it again")
    else:
        _header_uses[name] = _use(name, "damaged", info, f"{what}; torch's new build is rejected too ({again})")


def _use(name: str, verdict: str, info: os.stat_result, note: str = "") -> dict[str, Any]:
    return {
        "name": name,
        "verdict": verdict,
        "size": info.st_size,
        "mtime_ns": info.st_mtime_ns,
        "ino": info.st_ino,
        "note": note,
    }


def _header_check_command(compile_command: dict[str, Any], source: str, include: str) -> list[str]:
    """torch's own command line for compiling ``source`` with ``-include <include>`` under the options it
    precompiled the header with (``CppTorchDeviceOptions(**compile_command)``, as ``load_async`` builds the
    kernel that uses it), as an argv."""
    import shlex

    from torch._inductor.cpp_builder import CppBuilder
    from torch._inductor.cpp_builder import CppTorchDeviceOptions

    # extra_flags: link inputs torch strips before precompiling too; the mode flags: ours decides the mode.
    dropped = ("extra_flags", "compile_only", "precompiling", "preprocessing")
    options = {key: value for key, value in compile_command.items() if key not in dropped}
    build_option = CppTorchDeviceOptions(**options, compile_only=True)
    build_option.precompiled_header = include
    output = str(Path(source).with_suffix(""))
    return shlex.split(CppBuilder(name=output, sources=source, BuildOption=build_option).get_command_line())
