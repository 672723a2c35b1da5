"""``python -m pytest_compilecache``.

PYTEST_DONT_REWRITE
"""

import sys

from .cli import main

sys.exit(main())
