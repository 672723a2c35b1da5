"""The package version, in a leaf every module may import (the package root only re-exports).

PYTEST_DONT_REWRITE
"""

__version__ = "0.2.0"
