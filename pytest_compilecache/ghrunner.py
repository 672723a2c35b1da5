"""Everything this project writes for a CI runner goes through here, escaped.

GitHub's runner reads four channels, and each one can be hijacked by text we did not write (a bundle's
fingerprint facts, a store's error message, a test id):

* workflow commands (``::warning title=...::message``): the runner acts on any line of stdout or stderr
  that starts with ``::`` after its indentation, and on the older ``##[name]`` anywhere in a line, so a
  message with a newline could start a second command (``::error``, ``::add-mask``, ``::stop-commands``).
  Plain log lines with text from elsewhere go through :func:`one_line`, which breaks both forms; whole
  blocks (everything the CLI prints) through :func:`inert`, or :func:`inert_json` for JSON.
  :func:`command` escapes ``%``, CR and LF in the message and also ``:`` and ``,`` in properties, as the
  runner's own toolkit does (``@actions/core`` ``escapeData`` / ``escapeProperty``);
* ``GITHUB_OUTPUT`` and ``GITHUB_ENV`` files (``name=value`` lines): a value with a newline could set a
  second variable. :func:`append_vars` writes multi-line values in the heredoc form with a random
  delimiter that does not occur in the value, and refuses names that are not plain identifiers;
* the step summary (Markdown/HTML): :func:`md_text` and :func:`md_code` neutralise table pipes, HTML
  and line breaks in text that came from elsewhere, :func:`md_block` shows plain text of many lines as it is;
  :func:`append_summary` appends a rendered block.

Nothing here imports the rest of the package: the plugin, the CLI and the Action's Python all use it.
Loads lazily (inside the functions that need them, so a session pays only for what it uses): ``secrets``.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import os
import re
from typing import Any
from typing import Iterable
from typing import Mapping
from typing import TextIO

__all__ = [
    "StopTokenWatch",
    "annotate",
    "append_summary",
    "append_vars",
    "command",
    "escape_data",
    "escape_property",
    "in_github_actions",
    "inert",
    "inert_json",
    "md_block",
    "md_code",
    "md_text",
    "one_line",
    "resume_lines",
    "stop_tokens",
]

# Patterns are kept as strings: ``re`` compiles each on first use and caches it. Compiled at import they
# would cost every session, and most never look at them (bench/overhead.py --instructions).
_NAME = r"^[A-Za-z_][A-Za-z0-9_-]*$"


def in_github_actions(environ: Mapping[str, str] = os.environ) -> bool:
    """True inside a GitHub Actions job (the runner sets ``GITHUB_ACTIONS=true``)."""
    return environ.get("GITHUB_ACTIONS") == "true"


def escape_data(text: str) -> str:
    """Escape a workflow command's message: ``%``, CR and LF (the runner decodes them back)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """Escape a workflow command's property value (``title=...``): also ``:`` and ``,``."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def command(name: str, message: str = "", **properties: str) -> str:
    """One workflow command line, e.g. ``command("warning", msg, title="compile cache")``.

    ``name`` and property names are ours (checked, never escaped); the message and property values are
    escaped, so the result is exactly one line whatever they contain.
    """
    if not re.fullmatch(_NAME, name) or not all(re.fullmatch(_NAME, key) for key in properties):
        raise ValueError(f"invalid workflow command {name!r} or property name")
    props = ",".join(f"{key}={escape_property(value)}" for key, value in properties.items())
    return f"::{name}{' ' + props if props else ''}::{escape_data(message)}"


def write_command(stream: TextIO, name: str, message: str = "", **properties: str) -> None:
    """Write :func:`command` plus a newline to ``stream`` and flush (the runner reads lines as they come)."""
    stream.write(command(name, message, **properties) + "\n")
    stream.flush()


def one_line(text: str, limit: int = 2000) -> str:
    """``text`` as one inert log line: control characters shown escaped (``\\n``), cut at ``limit`` characters.

    The runner parses every line of a step's stdout and stderr for commands: ``::name::`` at the start of a
    line (after any indentation) and the older ``##[name]`` anywhere in it. Both are broken here (``::`` at
    the start becomes ``:\\:``, every ``##[`` becomes ``##\\[``), so text from a bundle, a store or the
    environment printed through this function is never a command, wherever it lands on the line.
    """
    return _cut(_inert_line(_printable(text)), limit)


def _inert_line(line: str) -> str:
    """``line`` (no line break in it) with both command forms broken; nothing else changed."""
    if "##[" in line:
        line = line.replace("##[", "##\\[")
    if line.lstrip().startswith("::"):  # Python's whitespace: a superset of what the runner's TrimStart strips
        line = line.replace("::", ":\\:", 1)
    return line


def inert(text: str) -> str:
    """Text of several lines, for a log, with no line the runner reads as a command; nothing else changed.

    Lines end where the runner ends them (LF, CR or CRLF; each becomes LF) and each is broken as by
    :func:`one_line` (``##[`` anywhere, ``::`` at the start after whitespace). For everything the CLI prints
    (its Markdown, its listings, argparse's messages), whose own line breaks are wanted. JSON goes through
    :func:`inert_json` instead, which keeps it valid."""
    return "\n".join(_inert_line(line) for line in re.split(r"\r\n|\r|\n", text))


def inert_json(text: str) -> str:
    """``json.dumps`` output (``ensure_ascii``, the default) with no line the runner reads as a command, and
    still the same JSON: ``##[`` can only occur inside a string, where ``[`` is spelled ``\\u005b`` instead. No
    line of such output starts with ``::`` (strings are quoted; control characters and line breaks escaped)."""
    return text.replace("##[", "##\\u005b")


def _printable(text: str) -> str:
    """``text`` on one line: every character that is not printable shown escaped (``\\n``, ``\\x1b``)."""
    text = str(text)
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# The runner's own commands (actions/runner, the IActionCommandExtension implementations and stop-commands).
# A line naming one of them is that command, so a "resume" line for a token spelled like one would run it
# whenever commands were not in fact stopped (``::warning::`` is an empty annotation).
_RUNNER_COMMANDS = frozenset(
    {
        "add-mask", "add-matcher", "add-path", "debug", "echo", "endgroup", "error", "group", "notice",
        "remove-matcher", "save-state", "set-env", "set-output", "stop-commands", "warning",
        "internal-set-repo-path",
    }
)  # fmt: skip
# How the runner unescapes a command's data: ``::name::data`` (TryParseV2) and ``##[name]data`` (TryParse),
# each replacement in its order (actions/runner src/Runner.Common/ActionCommand.cs).
_DATA_V2 = (("%0D", "\r"), ("%0A", "\n"), ("%25", "%"))
_DATA_V1 = (("%3B", ";"), ("%0D", "\r"), ("%0A", "\n"), ("%5D", "]"), ("%25", "%"))


def _unescape(data: str, mappings: tuple[tuple[str, str], ...]) -> str:
    for escaped, char in mappings:
        data = data.replace(escaped, char)
    return data


def _stop_token(line: str) -> str | None:
    """The token of ``line`` if the runner reads it as ``stop-commands`` (its parsers, ported), else None.

    The runner tries ``::name props::data`` after stripping leading whitespace, and only when that names no
    command of its own, ``##[name props]data`` at the first ``##[`` anywhere in the line; a name ends at the
    first space and compares ignoring case."""
    v2 = line.lstrip()
    if v2.startswith("::"):
        end = v2.find("::", 2)
        if end >= 0:
            name = v2[2:end].split(" ", 1)[0].lower()
            if name == "stop-commands":
                return _unescape(v2[end + 2 :], _DATA_V2)
            if name in _RUNNER_COMMANDS:
                return None  # another command: the older form is not tried
    start = line.find("##[")
    close = line.find("]", start) if start >= 0 else -1
    if close >= 0 and line[start + 3 : close].split(" ", 1)[0].lower() == "stop-commands":
        return _unescape(line[close + 1 :], _DATA_V1)
    return None


def _resumable(token: str) -> bool:
    """Whether ``::TOKEN::`` is read by the runner as the command ``TOKEN`` and as nothing else: printable,
    no space (a name ends there), no ``::`` and no ``:`` at the end (the name would end early), no ``##[``
    (the older form would find a command in the line), not a runner command."""
    return (
        bool(token)
        and token.isprintable()
        and " " not in token
        and "::" not in token
        and not token.endswith(":")
        and "##[" not in token
        and token.lower() not in _RUNNER_COMMANDS
    )


def stop_tokens(text: str) -> list[str]:
    """The tokens of the lines in ``text`` that stop the runner's command processing, in order, once each,
    leaving out those no line can resume (see :func:`resume_lines`).

    Output a runner shows before ours (a failing test's captured output or a warning, which pytest prints
    before the plugins' summaries) can stop the runner's command processing until a line ``::TOKEN::``;
    every annotation in between is printed as plain text. Lines end at LF, CR or CRLF, as the runner reads
    them."""
    if "stop-commands" not in text.lower():
        return []
    tokens: list[str] = []
    for line in re.split(r"\r\n|\r|\n", text):
        token = _stop_token(line)
        if token is not None and _resumable(token) and token not in tokens:
            tokens.append(token)
    return tokens


def resume_lines(tokens: list[str]) -> list[str]:
    """One ``::TOKEN::`` line per token of :func:`stop_tokens`: whichever of them stopped the runner's
    command processing, it resumes at its line; while commands run, a line naming no command is plain text."""
    return [f"::{token}::" for token in tokens if _resumable(token)]


def append_vars(path: str | os.PathLike[str] | None, values: Mapping[str, str]) -> None:
    """Append ``name=value`` entries to a ``GITHUB_OUTPUT``/``GITHUB_ENV`` file; nothing when ``path`` is unset.

    A value containing CR or LF, or starting or ending with whitespace, is written in the heredoc form
    ``name<<DELIM`` ... ``DELIM`` with a random delimiter checked not to occur in the value, so no value
    can end early or set another name. Names must be identifiers (``[A-Za-z_][A-Za-z0-9_-]*``): a
    ``ValueError`` otherwise, before anything is written.
    """
    for name in values:
        if not re.fullmatch(_NAME, name):
            raise ValueError(f"invalid GITHUB_OUTPUT/GITHUB_ENV name {name!r}")
    if not path:
        return
    import secrets

    lines: list[str] = []
    for name, value in values.items():
        value = str(value)
        if "\n" in value or "\r" in value or value != value.strip():
            delimiter = f"ghadelimiter_{secrets.token_hex(16)}"
            while delimiter in value:  # pragma: no cover - 128 random bits
                delimiter = f"ghadelimiter_{secrets.token_hex(16)}"
            lines.append(f"{name}<<{delimiter}\n{value}\n{delimiter}\n")
        else:
            lines.append(f"{name}={value}\n")
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("".join(lines))


def append_summary(path: str | os.PathLike[str] | None, markdown: str) -> None:
    """Append a rendered Markdown block (ending in a newline) to ``GITHUB_STEP_SUMMARY``, when set."""
    if not path:
        return
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(markdown if markdown.endswith("\n") else markdown + "\n")


# Backslash-escaped (CommonMark: any ASCII punctuation): emphasis, code, links, images, HTML, table pipes,
# strikethrough, and ``:`` and ``www.``, where GFM's autolinks start (``https://``, ``www.``).
_MD_SPECIAL = r"([\\`*_\[\]<>|~:])"
_MD_WWW = r"(?i)(www)\."  # GFM autolinks www. after a space, start, or any of *_~(


# An empty HTML comment: shown as nothing, but it splits the text around it, which no escape does.
MD_NO_AUTOLINK = "<!-- -->"


def md_text(text: str, limit: int = 500) -> str:
    """Untrusted text as inert Markdown on one line: no HTML, links (``[..](..)``, autolinked URLs,
    ``www.`` names and e-mail addresses), images, emphasis, code or table breaks.

    GFM autolinks ``name@host.tld`` whatever is escaped around it, so every ``@`` is followed by
    :data:`MD_NO_AUTOLINK`, the only raw HTML in the result (a reader sees the text unchanged)."""
    # No runner parses the summary for commands: the text needs no command-breaking (one_line's), only one line.
    escaped = re.sub(_MD_SPECIAL, r"\\\1", _cut(_printable(text), limit))
    escaped = re.sub(_MD_WWW, r"\1\\.", escaped).replace("&", "&amp;")
    return escaped.replace("@", "@" + MD_NO_AUTOLINK)


def md_code(text: str, limit: int = 500) -> str:
    """Untrusted text as an inline code span that nothing in it can close or break out of."""
    # GFM splits table cells at a pipe even inside code; "\|" is its escape (shown as "|" in a cell).
    flat = _cut(_printable(text), limit).replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", flat)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") or not flat else ""
    return f"{fence}{pad}{flat}{pad}{fence}"


def md_block(text: str) -> str:
    """Untrusted plain text of many lines as a fenced code block: shown line for line, nothing in it read as
    Markdown or HTML. The fence is longer than any run of backticks in the text, so no line can close it;
    characters that are not printable (other than the line breaks) are shown escaped."""
    lines = [_printable(line) for line in str(text).splitlines()]
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return "\n".join([fence + "text", *lines, fence]) + "\n"


class StopTokenWatch:
    """A pytest plugin object for a GitHub Actions job (controller only): the ``stop-commands`` tokens in what
    pytest prints before the plugins' summaries (each test's captured output and failure text, collection
    errors, warnings; under xdist the workers' reports and warnings arrive here too). A failing test that
    printed ``::stop-commands::T`` would otherwise turn every annotation after it into plain text. Output
    written live (``-s``, live logs) is not seen. Its hooks take pytest's report objects, duck-typed."""

    def __init__(self) -> None:
        self.tokens: list[str] = []

    def pytest_runtest_logreport(self, report: Any) -> None:
        self._scan(report)

    def pytest_collectreport(self, report: Any) -> None:
        self._scan(report)

    def pytest_warning_recorded(self, warning_message: Any) -> None:
        self._add(str(warning_message.message))  # the warnings summary comes before ours too

    def _scan(self, report: Any) -> None:
        for _, content in report.sections:
            self._add(content)
        if report.longrepr is not None:
            self._add(report.longreprtext)

    def _add(self, text: str) -> None:
        self.tokens += [token for token in stop_tokens(text) if token not in self.tokens]


def annotate(stream: TextIO, warnings: Iterable[str], errors: Iterable[str], tokens: list[str]) -> None:
    """Each warning and error as an annotation (escaped), one per problem (an error that was also a warning
    is annotated once, as the error), after the lines that resume the runner's command processing if a
    test's output stopped it (:func:`resume_lines`)."""
    errors = list(errors)
    if tokens:
        stream.write("".join(line + "\n" for line in resume_lines(tokens)))
    for message in warnings:
        if message not in errors:
            write_command(stream, "warning", message, title="compile cache")
    for message in errors:
        write_command(stream, "error", message, title="compile cache")
