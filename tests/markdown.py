"""What a reader of rendered Markdown sees of text that ``ghrunner.md_text`` escaped: tests compare that."""

from __future__ import annotations

import re


def shown(markdown: str) -> str:
    """``markdown`` with its CommonMark backslash escapes resolved (``save\\: a\\_b`` reads ``save: a_b``)."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown)
