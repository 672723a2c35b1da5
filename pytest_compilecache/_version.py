"""The package version, in a leaf every module may import (the package root only re-exports).

PYTEST_DONT_REWRITE
"""

__version__ = "0.3.0.dev0"
