"""The package version, in a leaf every module may import (the package root only re-exports)."""

__version__ = "0.1.0"
