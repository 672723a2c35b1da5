"""Whose dir this is: ours (our CACHEDIR.TAG), torch's (only torch's layout), empty, missing or foreign.

A *foreign* dir (a project folder, ``$HOME``) is never written into as a shared cache and nothing in it is
ever deleted: :func:`refuse_foreign` is the one rule every entry point that writes a cache dir applies.
Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``.._fs``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Literal
from typing import NamedTuple

from ..errors import ConfigError
from .layout import CLOEXEC
from .layout import KERNEL_DIR
from .layout import OUR_NAMES
from .layout import PENDING_DIR
from .layout import SESSIONS_DIR
from .layout import TORCH_DIRS
from .layout import TORCH_FILES
from .layout import TORCH_TOP_FILE
from .layout import is_temp_name
from .layout import kernel_entry

TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# Created by pytest-compilecache.\n"
_GITIGNORE = "# Created by pytest-compilecache.\n*\n"

Kind = Literal["ours", "torch", "empty", "missing", "foreign"]


class Ownership(NamedTuple):
    """Whose dir this is. ``foreign`` lists (up to three of) the entries that are nobody's cache."""

    kind: Kind
    foreign: tuple[str, ...] = ()


def ownership(path: str | os.PathLike[str]) -> Ownership:
    """Classify ``path``: ``ours`` (our CACHEDIR.TAG), ``torch`` (only torch's layout and our markers),
    ``empty``, ``missing`` or ``foreign``. Reads names only; follows no link but ``path`` itself."""
    root = Path(path)
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return Ownership("missing")
    except NotADirectoryError:
        return Ownership("foreign", (root.name,))
    if _tagged(root):
        return Ownership("ours")
    if not names:
        return Ownership("empty")
    foreign = _foreign(root, names)
    if foreign:
        return Ownership("foreign", tuple(foreign[:3]))
    return Ownership("torch")


def foreign_entries(path: str | os.PathLike[str]) -> list[str]:
    """The top-level names in ``path`` that are neither torch's cache layout nor our markers, whatever its tag
    says (a file a user put into a dir of ours). Raises OSError."""
    root = Path(path)
    return _foreign(root, sorted(os.listdir(root)))


def _foreign(root: Path, names: list[str]) -> list[str]:
    return [name for name in names if not torch_top_entry(root, name)]


def _tagged(root: Path) -> bool:
    tag = root / "CACHEDIR.TAG"
    try:
        if not stat.S_ISREG(os.lstat(tag).st_mode):
            return False
        with open(tag, encoding="utf-8", errors="replace") as fh:
            return fh.read(len(TAG) + 1) == TAG
    except OSError:
        return False


def torch_top_entry(root: Path, name: str) -> bool:
    """Is ``root/name`` part of torch's cache layout or one of our own markers? (no link counts)."""
    try:
        st = os.lstat(root / name)
    except OSError:
        return True  # vanished meanwhile: it was a temp file
    if stat.S_ISLNK(st.st_mode):
        return False
    if stat.S_ISDIR(st.st_mode):
        from .._fs import parse_temp_name

        if name in TORCH_DIRS or name in (SESSIONS_DIR, PENDING_DIR) or parse_temp_name(name) is not None:
            return True  # a temp-named dir is ours: a restore's staging dir (left by a killed one until swept)
        return bool(re.fullmatch(KERNEL_DIR, name)) and _kernel_dir_contents_ok(root / name)
    return name in OUR_NAMES or name in TORCH_FILES or bool(re.fullmatch(TORCH_TOP_FILE, name)) or is_temp_name(name)


def _kernel_dir_contents_ok(folder: Path) -> bool:
    """Does a two-character dir hold only what torch writes in a kernel dir (``<key>.<ext>`` with the key's
    2nd and 3rd characters the dir's name)? ``db/`` with ``backup_2024_01_01_full.sql`` does not."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return False
    return all(kernel_entry(folder.name, e.name) for e in entries if not e.is_symlink())


def refuse_foreign(path: str | os.PathLike[str], option: str = "--compile-cache-dir") -> None:
    """The one ownership rule of every entry point that writes a cache dir (pytest's shared dir, the CLI's
    ``restore --cache-dir``, the Action's ``cache-dir``): a dir that already holds someone else's files (a
    project folder, ``$HOME``) is refused with a :class:`ConfigError` naming ``option``. A missing, empty,
    ours or torch's dir passes; a path that is not a dir passes too (the caller's own creation fails then)."""
    found = ownership(path)
    if found.kind != "foreign" or not os.path.isdir(path):
        return
    shown = ", ".join(found.foreign)
    raise ConfigError(
        f"{option}: {path} is not a compile cache: it already holds files that are neither "
        f"pytest-compilecache's nor torch's ({shown}). The plugin would write torch's kernel dirs among "
        f"them and could never trim the dir safely; give it a new or empty directory, e.g. "
        f"{Path(path) / '.compilecache'}"
    )


def tag(path: Path) -> None:
    """Write our markers as new files, never through an existing name (a link planted since the dir was found
    empty); a regular file already there (a session racing us to tag the same empty dir) is left as it is."""
    for name, text in (("CACHEDIR.TAG", TAG), (".gitignore", _GITIGNORE)):
        try:
            fd = os.open(path / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | CLOEXEC, 0o644)
        except FileExistsError:
            if stat.S_ISREG(os.lstat(path / name).st_mode):
                continue
            raise
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
