"""torch's precompiled C++ headers (PCH): find the ones a session used, carry them, install them on a fresh runner.

The one home of the concept, and the facade the plugin, :mod:`..sync` and the Action (through
:mod:`..action_api`) call: :mod:`.names` (which files, where, how a manifest and a store name them),
:mod:`.locks` (torch's build locks, the background install's reservation), :mod:`.verdicts` (the record of
accepted headers), :mod:`.check` (the compiler's check, what each process reports, which headers were used),
:mod:`.transfer` (save and restore through a store). The package is named ``pch`` so that "header" keeps
meaning the bundle container's header (:mod:`..container`).

Why this exists. On CPU, torch (2.8+, ``torch/_inductor/codecache.py``) compiles every C++ kernel with
``-include <dir>/<hash>.h``, where ``<hash>.h.gch`` is a ~150 MB precompiled header built by
``_precompile_header``. That function runs once per process for every header it is asked for (it is a
``functools.cache``), from ``CppCodeCache.load_async`` for every kernel key not yet in memory, *before* the
kernel binary is looked up on disk: it preprocesses the header (``g++ -E``), hashes the result (``openssl
sha512``), names the file after the hash of the command line, the preprocessed text and the compiler version,
and compiles it unless the file exists. So a fresh CI runner whose cache dir was fully restored still spends
seconds of g++ on a header it needs for no kernel at all. The header's path is part of no kernel or FX key.

Where the headers go (the design decision). torch keeps them in
``_HEADER_DIR = <tempfile.gettempdir()>/torchinductor_<user>/precompiled_headers``, fixed when
``codecache`` is imported and deliberately outside ``TORCHINDUCTOR_CACHE_DIR`` (torch's comment: the headers
"need to be global", pytorch/pytorch#144002). We restore into that same directory rather than pointing torch at
a directory inside the cache dir, because:

* it needs no private torch state: :func:`header_dir` mirrors ``default_cache_dir()`` without importing torch,
  and pointing torch elsewhere would mean rewriting ``codecache._HEADER_DIR`` in every process before its
  first compile, which the plugin cannot do for xdist workers' subprocesses, tests that spawn Python, or
  torch's own compile workers;
* it works the same on every torch that has the feature, and is a no-op on those that do not (2.7: nothing
  ever appears in the directory, so nothing is found, described or installed);
* a header is tied to the compiler, the flags and the torch install, all of which its name already hashes,
  so one directory can hold several without conflict, and a header that does not match is simply never
  looked up;
* the cache dir stays what torch and the bundles expect (no 150 MB file inside every whole-dir archive).

What we never do there: follow a symlink, or write a name that is not torch's (``c`` + 51 base32 chars +
``.h.gch``/``.h.pch``). Only the compiled file travels: torch writes the tiny ``<hash>.h`` itself (its content
is a single ``#include`` line) before it looks for the compiled file.

Which headers a session used. Not from access times: ``relatime`` (Linux's default, GitHub's
runners) records a read only once a day and ``noatime`` never. Every process the plugin runs in wraps torch's
``_precompile_header`` (:func:`.probe.watch_precompiled_headers`): each header torch looks up there is
checked once by that process, with torch's own flags for it, and reported (:class:`HeaderUse`, through the
xdist worker payload). torch's compile workers never look a header up (the parent passes its path), so
nothing is lost there; a header the restore installed (this session's, or the Action's, named in
``PYTEST_COMPILECACHE_RESTORED``) is named again even when no process looked it up.

Only a header the compiler accepts is carried or left installed. gcc's reaction to a damaged ``.gch`` is
anything from silently ignoring it (all zeros, junk after a valid start: every kernel then parses the text
header, and torch never rebuilds the file) to "cannot read PCH file" (truncated) or an internal compiler error
(changed bytes): fatal for every C++ kernel on that machine, since neither torch nor gcc ever replaces an
existing header. :func:`check` compiles a one-line file with ``-include`` of the header under torch's exact
flags and no text header to fall back on, so only a loaded PCH compiles (about half a second for a ~150 MB
header). A header that fails is removed under torch's build lock, and torch builds it again in the same
process, with one note (:func:`remove_if_unchanged`). An accepted header is remembered in a small record
beside it (:data:`VERDICTS`), keyed by the file's identity (device, inode, size, mtime, ctime), the check's
argv and the compiler binary: the next process that looks up that very file runs no compiler, so warm runs
and every xdist worker after the first pay nothing; any change to the file or the check means a new check.
A save uploads only headers some process of the
session checked and that have not changed since; a restore replaces a local header of the manifest's name
that is no PCH at all (zeroed, junk) with the verified one. Partial files of a killed build under temporary
names are never candidates: only torch's final names are. Limits: gcc loads a PCH lazily, so bytes changed
deep inside that a one-line file never touches pass the check (the sha256 guards them in transit); a header
looked up only by a process without the plugin (a test that spawns Python, torch's subprocess FX-compile
mode) is not carried, since nothing checked it.

This package never imports torch: everything here is files, hashes and one compiler run per check. Transport
is zstd (level 3, ~150 MB to ~21 MB in about a second), streamed in both directions so memory stays bounded.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

from ..errors import HeaderError
from .check import OK_VERDICTS
from .check import HeaderUse
from .check import after_compile_error
from .check import after_silent_compile_error
from .check import check
from .check import find_built
from .check import find_used
from .check import header_notes
from .check import header_uses
from .check import remove_if_unchanged
from .locks import Reservation
from .locks import reserve_headers
from .locks import wait_while_built
from .names import CHECK_TIMEOUT
from .names import KIND
from .names import MAX_SIZE
from .names import describe
from .names import header_artifact
from .names import header_dir
from .names import is_damaged_copy
from .names import is_header_name
from .names import looks_complete
from .names import object_key
from .names import packed_bound
from .names import session_start
from .transfer import IDLE_SAVES
from .transfer import ZSTD_LEVEL
from .transfer import HeaderTransfer
from .transfer import Store
from .transfer import compress
from .transfer import install_header
from .transfer import restore_headers
from .transfer import save_headers
from .transfer import sweep_leftovers
from .transfer import verify_header_copy
from .verdicts import SETTLED_NS
from .verdicts import VERDICTS

__all__ = [
    "CHECK_TIMEOUT",
    "HeaderError",
    "HeaderTransfer",
    "HeaderUse",
    "IDLE_SAVES",
    "KIND",
    "MAX_SIZE",
    "OK_VERDICTS",
    "Reservation",
    "SETTLED_NS",
    "after_compile_error",
    "after_silent_compile_error",
    "Store",
    "VERDICTS",
    "ZSTD_LEVEL",
    "check",
    "compress",
    "describe",
    "find_built",
    "find_used",
    "header_artifact",
    "header_dir",
    "header_notes",
    "header_uses",
    "install_header",
    "is_damaged_copy",
    "is_header_name",
    "looks_complete",
    "object_key",
    "packed_bound",
    "remove_if_unchanged",
    "reserve_headers",
    "restore_headers",
    "save_headers",
    "session_start",
    "sweep_leftovers",
    "verify_header_copy",
    "wait_while_built",
]
