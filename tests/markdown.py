"""What a reader of rendered Markdown sees of text that ``ghrunner.md_text`` escaped: tests compare that."""

from __future__ import annotations

import re

from pytest_compilecache.ghrunner import MD_NO_AUTOLINK


def shown(markdown: str) -> str:
    """``markdown`` with its CommonMark backslash escapes resolved (``save\\: a\\_b`` reads ``save: a_b``) and
    without the empty comments that keep e-mail addresses from becoming links (``ghrunner.MD_NO_AUTOLINK``)."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown.replace(MD_NO_AUTOLINK, ""))
