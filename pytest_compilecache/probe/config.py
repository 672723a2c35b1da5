"""torch's cache dir and config switches: pointing torch at a dir, putting its config back, isolated compiles,
and importing its compiler early.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import sys
import tempfile
from typing import Any
from typing import Iterator

from .._env import CACHE_ENV
from .._env import DISABLE_ENV as DISABLE_ENV  # re-exported: probe.DISABLE_ENV
from .._env import DISABLE_ENVS
from .._env import REMOTE_SWITCHES as REMOTE_SWITCHES  # re-exported: probe.REMOTE_SWITCHES
from .._env import TRITON_ENV
from .._env import cache_dir_env
from .hooks import CODECACHE
from .hooks import torch_loaded
from .megacache import collect_used_modules


def import_compiler() -> bool:
    """Import torch's compiler (``torch._inductor.codecache``, which brings dynamo and inductor) now, in a
     process whose tests already imported torch; True when it is imported. Never imports torch itself.

     For an xdist worker that would otherwise sit idle while another worker restores the session's bundle
    : the first ``torch.compile`` pays this import anyway (about 1.5 s of CPU), and the hash of
     torch's sources every FX-graph key includes (0.2 s), so both are done while waiting. Nothing in the
     import reads the cache dir's entries; torch fixes its precompiled-header dir from TMPDIR, which the
     worker already has.
    """
    if not torch_loaded():
        return False
    try:
        codecache = importlib.import_module(CODECACHE)
        # The hash of torch's own sources that every FX-graph key includes (cached for the process).
        torch_key = getattr(codecache, "torch_key", None)
        if callable(torch_key):
            torch_key()
    except Exception:  # a torch that cannot compile here: its first compile will say why
        return False
    return True


# --------------------------------------------------------------------------- cache dirs


def point_cache_dir(cache_dir: str | None, *, disable: bool = False) -> str | None:
    """Make torch use ``cache_dir`` (absolute) from now on; return a note when torch was imported earlier.

    Environment variables are enough before torch is imported. After, torch's in-memory code caches
    still hold kernels from the old dir, so we clear them; some paths are fixed at import (Dynamo's
    precompile cache, precompiled headers), which the note names.
    """
    if cache_dir is not None:
        os.environ.update(cache_dir_env(cache_dir))
    if disable:
        os.environ[DISABLE_ENV] = "1"
    if "torch._inductor" not in sys.modules:
        if disable:  # torch will read the variable at import, and keep what it read for the process
            _config_before.setdefault(_READ_AT_IMPORT, True)
        return None
    note = "torch was imported before pytest-compilecache configured the session"
    with contextlib.suppress(Exception):
        from torch._inductor import config as inductor_config

        if not _clear_inductor_caches():
            return note + "; could not clear its in-memory kernels (no clear_caches), compiles may use the old dir"
        if disable:
            _config_before.setdefault("force_disable_caches", inductor_config.force_disable_caches)
            inductor_config.force_disable_caches = True
        return note + "; switched its cache dir in-process (Dynamo's precompile cache stays where it was)"
    return note + "; could not switch its cache dir in-process, compiles may use the old dir"


# What point_cache_dir changed in torch's config, for put_back_config: inductor config values as they were
# before (torch already imported), or _READ_AT_IMPORT (torch not imported yet, but told by the variable).
_config_before: dict[str, Any] = {}
_READ_AT_IMPORT = "(force_disable_caches read from the environment at import)"
_FORCE_DISABLE_ENVS = DISABLE_ENVS


def put_back_config() -> None:
    """Undo what :func:`point_cache_dir` changed in torch's config, after the lease put the environment back:
    after a ``disabled`` session run in-process (pytester, an IDE), later sessions cache again.

    torch reads ``TORCHINDUCTOR_FORCE_DISABLE_CACHES`` once, at import, and keeps it: 2.8+ as a forced
    value of its config entry (``torch.compiler.config``, which a plain assignment does not override), 2.7
    as a module attribute. When torch was imported while the session's variable was set, the value is read
    again from the environment as it is now.
    """
    changed = dict(_config_before)
    _config_before.clear()
    config = sys.modules.get("torch._inductor.config")
    if not changed or config is None:
        return
    with contextlib.suppress(Exception):
        for name, value in changed.items():
            if name != _READ_AT_IMPORT:
                setattr(config, name, value)
        if _READ_AT_IMPORT in changed:
            _reread_force_disable_caches(config)


def _reread_force_disable_caches(config: Any) -> None:
    compiler_config = sys.modules.get("torch.compiler.config")
    entry = getattr(compiler_config, "_config", {}).get("force_disable_caches")
    if entry is not None and hasattr(entry, "env_value_force"):  # torch 2.8+
        from torch.utils import _config_module

        unset = _config_module._UNSET_SENTINEL
        values = (_config_module._read_env_variable(name) for name in _FORCE_DISABLE_ENVS)
        entry.env_value_force = next((value for value in values if value is not None), unset)
    else:  # torch 2.7: a module attribute computed at import
        config.force_disable_caches = os.environ.get(DISABLE_ENV) == "1"


@contextlib.contextmanager
def isolated_compile(disable: bool = False) -> Iterator[str]:
    """A true cold compile for one test: a fresh dir, torch's in-memory caches cleared, all put back after.

    Yields the temporary cache dir. Switching only the environment variable would silently reuse
    kernels held in memory, hence the ``clear_caches`` and ``torch._dynamo.reset`` on both sides.
    """
    import torch
    from torch._inductor import config as inductor_config

    saved = {name: os.environ.get(name) for name in (CACHE_ENV, TRITON_ENV)}
    tmp = tempfile.mkdtemp(prefix="compilecache-test-")
    collect_used_modules()
    torch._dynamo.reset()
    _clear_inductor_caches()
    os.environ.update(cache_dir_env(tmp))
    try:
        with inductor_config.patch(force_disable_caches=disable, fx_graph_remote_cache=False):
            yield tmp
    finally:
        torch._dynamo.reset()
        _clear_inductor_caches()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(tmp, ignore_errors=True)


def _clear_inductor_caches() -> bool:
    """Forget the kernels torch holds in memory; False when this torch offers no way to (see capability_notes).

    ``torch._inductor.utils.clear_caches`` from torch 2.8; torch 2.7 calls the same function
    ``clear_inductor_caches`` (kept as an alias later).
    """
    from torch._inductor import utils

    clear = getattr(utils, "clear_caches", None) or getattr(utils, "clear_inductor_caches", None)
    if clear is None:
        return False
    clear()
    return True
