"""``python -m pytest_compilecache``."""

import sys

from .cli import main

sys.exit(main())
