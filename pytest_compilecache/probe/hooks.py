"""When torch is loaded, and wrapping a torch module the moment it is imported: what every probe module shares;
:func:`watch_dynamo`, which the session calls at its start, loads ``counters`` and ``dynamo`` only once torch
loads Dynamo.

Imports nothing of torch.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any
from typing import Callable


def torch_loaded() -> bool:
    """True once the session imported torch; the plugin never imports it on its own in a plain session."""
    return "torch" in sys.modules


def dynamo_loaded() -> bool:
    return "torch._dynamo.utils" in sys.modules


CODECACHE = "torch._inductor.codecache"


class LogTap(logging.Filter):
    """Reads records torch logs at ``level`` or above on one logger, whatever the user's logging shows.

    :func:`tap_log` puts it on the logger. ``read`` is given each such record; the record then goes on only
    where the user's configuration, as it is at that moment, would have shown it (``TORCH_LOGS``,
    ``torch._logging.set_logs`` or ``logging``, also when set later).
    """

    def __init__(self, logger: logging.Logger, level: int, read: Callable[[logging.LogRecord], None]) -> None:
        super().__init__()
        self.logger = logger
        self.level = level
        self.read = read

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= self.level:
            with contextlib.suppress(Exception):  # a record of another shape is not ours to read
                self.read(record)
        return logging.Logger.isEnabledFor(self.logger, record.levelno)


def tap_log(name: str, level: int, read: Callable[[logging.LogRecord], None]) -> LogTap:
    """Put a :class:`LogTap` on logger ``name``: the logger makes every record at ``level`` or above.

    No level changes anywhere: the logger's own ``isEnabledFor`` also says yes at ``level``, so its children
    (torch's artifact loggers) and a level set later behave as they would without the tap.
    """
    logger = logging.getLogger(name)
    tap = LogTap(logger, level, read)
    configured = logger.isEnabledFor

    def enabled(at: int) -> bool:
        return at >= level or configured(at)

    logger.isEnabledFor = enabled  # type: ignore[method-assign,assignment]
    logger.addFilter(tap)
    return tap


class _InstallOnImport:
    """A ``sys.meta_path`` entry that calls ``install`` right after torch imports module ``module``.

    torch imports ``torch._inductor.codecache`` (and ``remote_cache``) lazily, at the first compile,
    inside a test; without this the first test's lookups would pass before we could wrap anything. It
    answers only for that one module name (one string comparison per import otherwise) and removes itself
    once used.
    """

    def __init__(self, module: str, install: Any) -> None:
        self.module = module
        self.installs = [install]  # one entry per module: the first finder to answer is the only one asked

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.module:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if spec is None or exec_module is None:
            return spec

        installs = self.installs

        def exec_and_install(module: Any) -> None:
            exec_module(module)
            for install in installs:
                with contextlib.suppress(Exception):
                    install()

        loader.exec_module = exec_and_install  # type: ignore[union-attr]
        return spec


def install_now_or_on_import(module: str, install: Any, *, pending: bool) -> None:
    if module in sys.modules:
        install()
        return
    if not pending:
        return
    hook = next((f for f in sys.meta_path if isinstance(f, _InstallOnImport) and f.module == module), None)
    if hook is None:
        sys.meta_path.insert(0, _InstallOnImport(module, install))
    elif install not in hook.installs:
        hook.installs.append(install)  # another wrapper of the same module (graph lookups, headers)


def watch_dynamo() -> None:
    """From the moment torch loads Dynamo (now, if it has): keep every compilation record, not from the next
    test's start (a first compiling test with more than 64 frames would otherwise lose some of its own), and
    count every graph break torch logs (:func:`.dynamo.tap_graph_breaks`). Loads neither module before then."""
    install_now_or_on_import("torch._dynamo.utils", _keep_every_record, pending=True)
    install_now_or_on_import("torch._dynamo.symbolic_convert", _tap_graph_breaks, pending=True)
    # Before any compile can bypass the FX-graph cache or hit the recompile limit (one in a test module's
    # import, at collection, too): the first test's mark would be too late for those.
    install_now_or_on_import(CODECACHE, _tap_logs, pending=True)
    install_now_or_on_import("torch._dynamo.convert_frame", _tap_logs, pending=True)


def _keep_every_record() -> None:
    from .counters import keep_every_record

    keep_every_record()


def _tap_logs() -> None:
    from .counters import tap_logs

    tap_logs()


def _tap_graph_breaks() -> None:
    from .dynamo import tap_graph_breaks

    tap_graph_breaks()
