"""ghrunner: every channel a CI runner reads gets text that cannot break out of its place."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from pytest_compilecache import ghrunner

HOSTILE = [
    "x\n::error title=Injected::owned",
    "x\r\n::add-mask::secret",
    "100% done %0A::error::",
    "a::b,c:d",
    "| cell | <img src=x onerror=alert(1)> [link](http://evil) `code` **bold** </details>",
    "name=value\nother=1",
]


def _parse_output_file(text: str) -> dict[str, str]:
    """What GitHub's runner reads from a GITHUB_OUTPUT/GITHUB_ENV file (its documented grammar)."""
    values: dict[str, str] = {}
    lines = text.split("\n")
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if not line:
            continue
        heredoc = re.fullmatch(r"([^=<]+)<<(.+)", line)
        if heredoc and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = heredoc.groups()
            body: list[str] = []
            while lines[index] != delimiter:
                body.append(lines[index])
                index += 1
            index += 1
            values[name] = "\n".join(body)
        else:
            name, value = line.split("=", 1)
            values[name] = value
    return values


def _decode(message: str) -> str:
    return message.replace("%0D", "\r").replace("%0A", "\n").replace("%3A", ":").replace("%2C", ",").replace("%25", "%")


@pytest.mark.parametrize("text", HOSTILE)
def test_workflow_commands_stay_one_line_and_round_trip(text: str) -> None:
    line = ghrunner.command("warning", text, title=text)
    assert "\n" not in line and "\r" not in line
    head, message = line[2:].split("::", 1)
    name, props = head.split(" ", 1)
    assert name == "warning"
    assert "," not in props.split("=", 1)[1] and "::" not in props
    assert _decode(message) == text
    assert _decode(props.split("=", 1)[1]) == text


def test_write_command_flushes_one_line() -> None:
    stream = io.StringIO()
    ghrunner.write_command(stream, "error", "two\nlines", title="t")
    assert stream.getvalue() == "::error title=t::two%0Alines\n"


def test_command_names_are_ours() -> None:
    with pytest.raises(ValueError):
        ghrunner.command("warning::x", "m")
    with pytest.raises(ValueError):
        ghrunner.command("warning", "m", **{"bad name": "v"})


@pytest.mark.parametrize("text", HOSTILE + ["plain", " padded ", ""])
def test_output_values_cannot_set_other_names(tmp_path: Path, text: str) -> None:
    target = tmp_path / "github_output"
    target.write_text("earlier=1\n")
    ghrunner.append_vars(target, {"restore-outcome": text, "cache-hit": "false"})
    assert _parse_output_file(target.read_bytes().decode()) == {
        "earlier": "1",
        "restore-outcome": text,
        "cache-hit": "false",
    }


def test_output_names_are_checked_before_writing(tmp_path: Path) -> None:
    target = tmp_path / "github_env"
    with pytest.raises(ValueError, match="name"):
        ghrunner.append_vars(target, {"ok": "1", "bad\nname": "2"})
    assert not target.exists()
    ghrunner.append_vars(None, {"ok": "1"})  # no file configured: nothing to do


def test_summary_appends_a_block(tmp_path: Path) -> None:
    target = tmp_path / "summary.md"
    ghrunner.append_summary(target, "# one")
    ghrunner.append_summary(target, "# two\n")
    assert target.read_text() == "# one\n# two\n"


@pytest.mark.parametrize("text", HOSTILE)
def test_markdown_text_is_inert(text: str) -> None:
    cell = ghrunner.md_text(text)
    assert "\n" not in cell and "\r" not in cell
    # no raw HTML tag can open: the one raw HTML is the empty comment after each "@"
    assert "<" not in cell.replace("\\<", "").replace(ghrunner.MD_NO_AUTOLINK, "")
    assert "|" not in cell.replace("\\|", "")  # no table cell can split
    assert "](" not in cell.replace("\\](", "")  # no link


@pytest.mark.parametrize("text", HOSTILE + ["``ticks``", "`"])
def test_markdown_code_cannot_be_closed_early(text: str) -> None:
    span = ghrunner.md_code(text)
    fence = re.match(r"`+", span)
    assert fence is not None
    inner = span[len(fence.group()) : -len(fence.group())]
    assert fence.group() not in inner and "\n" not in span
    assert "|" not in inner.replace("\\|", "")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("x ##[stop-commands]tok", "x ##\\[stop-commands]tok"),  # the runner's older syntax, anywhere in a line
        ("::error::pwned", ":\\:error::pwned"),
        ("  ::add-mask::e", "  :\\:add-mask::e"),  # the runner strips indentation before parsing
        ("a::b ::c", "a::b ::c"),  # not at the start: no command
        ("line\n::error::x", "line\\n::error::x"),  # one line: the second line never starts
    ],
)
def test_one_line_is_never_a_runner_command(text: str, shown: str) -> None:
    assert ghrunner.one_line(text) == shown
    assert "##[" not in shown.replace("##\\[", "") and not shown.lstrip().startswith("::")


def test_one_line_bounds_length() -> None:
    assert ghrunner.one_line("a\nb\tc") == "a\\nb\\tc"
    assert len(ghrunner.one_line("x" * 5000, limit=100)) == 100


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("::stop-commands::abc123", ["abc123"]),
        ("log\n    ::stop-commands::tok-1\nmore", ["tok-1"]),  # after indentation
        ("::STOP-COMMANDS::Tok", ["Tok"]),  # the runner compares command names ignoring case
        ("::stop-commands key=v::tok", ["tok"]),  # properties do not change the command
        ("prefix ##[stop-commands]old.style", ["old.style"]),  # the old form, anywhere in a line
        ("::stop-commands::a\r\n::a::\n::stop-commands::b\n::stop-commands::a", ["a", "b"]),  # in order, once
        ("echo ::stop-commands::mid-line", []),  # not a command: '::' must start the line
        ("::stop-commands::has space", []),  # cannot be spelled back as one command name
        ("::stop-commands::a:", []),  # '::a:::' names the command 'a'
        ("::stop-commands::x##[y", []),  # its resume line would hold the older form's prefix
        ("::stop-commands::a:b", ["a:b"]),
        ("::stop-commands::100%25", ["100%"]),  # the runner unescapes the data: '::100%::' resumes it
        ("##[stop-commands]tok%5D%3B", ["tok];"]),  # the older form's own escapes
        ("::stop-commands::c3RvcA+/x=", ["c3RvcA+/x="]),  # base64, a GUID: any name without a space
        ("::stop-commands::{1b4e28ba-2fa1}", ["{1b4e28ba-2fa1}"]),
        ("progress 50%\r::stop-commands::cr", ["cr"]),  # a lone CR ends a line for the runner
        ("\v\f\u00a0::stop-commands::ws", ["ws"]),  # .NET's TrimStart: every kind of whitespace
        ("::stop-commands\tx::##[stop-commands]tab", ["tab"]),  # not a ::name (a tab is no separator): the older form
        ("::warning::##[stop-commands]x", []),  # a ::warning, so the older form is not tried
        ("  disk nearly full\n  ::stop-commands::warntok", ["warntok"]),  # as pytest's warnings summary indents
        ("::stop-commands::", []),
        ("::stop-commands::warning", []),  # its resume line would be an empty annotation when not stopped
        ("::stop-commands::Add-Mask", []),
        ("nothing to see", []),
    ],
)
def test_stop_tokens_are_those_a_resume_line_can_end(text: str, tokens: list[str]) -> None:
    assert ghrunner.stop_tokens(text) == tokens


def test_resume_lines_name_each_token_as_a_bare_command() -> None:
    assert ghrunner.resume_lines(["abc", "tok-1"]) == ["::abc::", "::tok-1::"]
    assert ghrunner.resume_lines(["a b", "warning", "x\n::error::y"]) == []  # never a command of ours


def test_annotations_come_after_the_resume_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_compilecache import plugin
    from pytest_compilecache.problems import Problems

    class Role:
        problems = Problems()

    Role.problems.warn("store down")
    output = ghrunner.StopTokenWatch()
    output.tokens = ["t1", "t2"]
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    plugin._github_commands(Role(), output)  # type: ignore[arg-type]
    assert out.getvalue().splitlines() == ["::t1::", "::t2::", "::warning title=compile cache::store down"]

    out.truncate(0)
    out.seek(0)
    plugin._github_commands(type("Quiet", (), {"problems": Problems()})(), output)
    assert out.getvalue() == ""  # nothing to annotate: the runner's state is left as the tests left it


# Rendered by cmark-gfm (GitHub's Markdown engine, with its table, autolink and strikethrough extensions)
# with raw HTML allowed, so that nothing here relies on GitHub's sanitiser: what md_text escapes must come
# out as plain text in its own table cell.
RENDERED = HOSTILE + [
    "see https://evil.example/x and HTTP://EVIL.example",
    "www.evil.example and _www.evil.example and (WWW.evil.example)",
    "_emphasis_ __strong__ *a* ~~gone~~ `code` ![img](http://x/y.png) <https://x.example>",
    "a:b::c ::error:: 100% &amp; &lt;b&gt; \\| \\\\",
    "::error::test id ##[group]x\tafter a tab",
    "mail attacker@evil.example, mailto:x@evil.example and xmpp:y@evil.example/z",
]
_ALLOWED_TAGS = {"table", "thead", "tbody", "tr", "th", "td"}


@pytest.mark.parametrize("text", RENDERED)
def test_markdown_text_renders_as_the_text_itself_in_its_cell(text: str) -> None:
    import html

    import cmarkgfm
    from cmarkgfm.cmark import Options

    table = f"| cell | next |\n|---|---|\n| {ghrunner.md_text(text)} | after |\n"
    rendered = cmarkgfm.github_flavored_markdown_to_html(table, options=Options.CMARK_OPT_UNSAFE)
    tags = set(re.findall(r"</?([a-zA-Z][a-zA-Z0-9]*)", rendered))
    assert tags <= _ALLOWED_TAGS, (tags, rendered)  # no link, image, emphasis, code or HTML of the text's own
    cells = re.findall(r"<td>(.*?)</td>", rendered, flags=re.S)
    assert len(cells) == 2 and cells[1] == "after", rendered  # the text stayed in its cell
    # shown as it was (on one line: a line break as "\n"), with nothing added to break runner commands; the
    # empty comments that stop e-mail autolinks show as nothing
    assert html.unescape(cells[0].replace(ghrunner.MD_NO_AUTOLINK, "")) == ghrunner._printable(text).strip()


@pytest.mark.parametrize(
    "text",
    ["##[error]x", "a ##[add-mask]b", "x\n::error::y", "x\r  ::warning::y", "x\r\n\t::add-mask::y", "::", "###[a]"],
)
def test_inert_blocks_keep_their_lines_and_lose_their_commands(text: str) -> None:
    # Issue 28.7: what the CLI prints goes through inert (Markdown, listings) or inert_json (JSON).
    def commands(block: str) -> list[str]:
        return [line for line in re.split(r"\r\n|\r|\n", block) if line.lstrip().startswith("::") or "##[" in line]

    assert commands(text)  # each case is one the runner would act on
    block = ghrunner.inert(f"first line\n{text}\nlast `code` | cell")
    assert commands(block) == []
    assert block.startswith("first line\n") and block.endswith("\nlast `code` | cell")
    assert ghrunner.inert("plain\ntext: with :: inside\n") == "plain\ntext: with :: inside\n"
    dumped = json.dumps({"k": text, "list": [text]}, indent=2)
    assert commands(ghrunner.inert_json(dumped)) == []
    assert json.loads(ghrunner.inert_json(dumped)) == {"k": text, "list": [text]}


def test_md_block_is_a_code_block_nothing_in_it_can_close() -> None:
    text = "a <b>x</b>\n``````\n\x1b[31m ~~~"
    block = ghrunner.md_block(text)
    lines = block.splitlines()
    assert lines[0] == "`" * 7 + "text" and lines[-1] == "`" * 7 and block.endswith("\n")
    assert lines[1:-1] == ["a <b>x</b>", "``````", "\\x1b[31m ~~~"]
    assert ghrunner.md_block("plain") == "```text\nplain\n```\n"
