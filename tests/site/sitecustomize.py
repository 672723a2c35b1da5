"""Loaded at start-up by every Python process the suite starts (tests/torchenv.py puts this dir on PYTHONPATH).

At exit, after every other exit handler, move every object the garbage collector tracks into its permanent
generation, so that the interpreter's shutdown does not walk them all again. A process that imported torch and
compiled something holds millions of tracked objects; walking them at shutdown costs it 1-2.5 CPU-seconds here
(about a fifth of a small compiled pytest session), the suite's largest cost after the torch imports.

Nothing the suite checks happens in that walk: it finds only cycles of garbage, whose finalizers Python does not
promise to run at exit, and every file the plugin writes is closed by the code that writes it. The handler
registered here runs after those registered later (exit handlers run in reverse order of registration).

A ``sitecustomize.py`` further along ``sys.path`` (bench/suite_cost.py's probe, a distribution's own) still runs:
this one runs it after registering the handler.
"""

import atexit
import gc
import os
import sys

atexit.register(gc.freeze)


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
