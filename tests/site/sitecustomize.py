"""Loaded at start-up by every Python process the suite starts (tests/torchenv.py puts this dir on PYTHONPATH).

A process that imported torch holds millions of objects the garbage collector tracks, nearly all of them torch's
modules, classes and functions, alive until the process ends. Each full collection walks them all again: about
half a second each here, several times while torch is imported, twice in pytest's own clean-up (its unraisable-
exception check calls ``gc.collect()``) and once more at interpreter shutdown. That was a quarter of the CPU of a
small compiled pytest session, and 1-2.5 CPU-seconds of it at shutdown alone. So here:

* after every full collection, the objects that survived it move to the permanent generation (``gc.freeze()``),
  which later collections do not walk: they look only at objects made since;
* at exit, after every other exit handler, everything moves there, so the shutdown walks nothing.

Nothing a test checks depends on this. Reference counting frees what it frees as before; a collection still finds
the cycles of garbage made since the last one. A cycle of objects that had survived a full collection is no
longer freed before the process ends: memory, in processes that live for one test. Finalizers of objects alive at
exit Python never promised to run, and every file the plugin writes is closed by the code that writes it. The
exit handler registered here runs after those registered later (exit handlers run in reverse order).

A ``sitecustomize.py`` further along ``sys.path`` (bench/suite_cost.py's probe, a distribution's own) still runs:
this one runs it after registering the handler.
"""

import atexit
import gc
import os
import sys

atexit.register(gc.freeze)


def _freeze_survivors(phase: str, info: dict[str, int]) -> None:
    if phase == "stop" and info["generation"] == 2:
        gc.freeze()


gc.callbacks.append(_freeze_survivors)


def _run_next() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    entries = [os.path.abspath(entry or os.curdir) for entry in sys.path]
    for folder in entries[entries.index(here) + 1 :] if here in entries else ():
        path = os.path.join(folder, "sitecustomize.py")
        if folder != here and os.path.isfile(path):
            with open(path, encoding="utf-8") as source:
                code = compile(source.read(), path, "exec")
            exec(code, {"__name__": "sitecustomize", "__file__": path, "__builtins__": __builtins__})
            return


_run_next()
