"""What the CLI prints, made safe for the operator's terminal.

An event id, an event type, a header or an error message is text a sender
chose. Printed raw, `ESC ] 52 ;` writes the operator's clipboard, `ESC ] 0 ;`
retitles the window, a CSI clears or rewrites the screen, and a C1 control
(U+0080-U+009F) does the same on terminals that read them — through a pipe
to `less -R` as well. So every command prints through `echo`, which writes
each C0 control but the newline, DEL and each C1 control as `\\u00XX`: the
operator sees what was sent, the terminal obeys none of it, and `--json`
output stays JSON that parses to the same text. A field printed within one
line of a table goes through `one_line`, which escapes its newlines too.
"""

import click

_ESCAPED = {code: f"\\u{code:04x}" for code in (*range(0x20), *range(0x7F, 0xA0)) if code != 0x0A}
_ESCAPED_IN_A_LINE = {**_ESCAPED, 0x0A: "\\u000a"}


def printable(text: str) -> str:
    """`text` with every control character but the newline escaped."""
    return text.translate(_ESCAPED)


def one_line(text: str) -> str:
    """`text` with every control character escaped, the newline too: one line of a table."""
    return text.translate(_ESCAPED_IN_A_LINE)


def echo(text: str = "", err: bool = False, nl: bool = True) -> None:
    """`click.echo`, escaped (`printable`)."""
    click.echo(printable(text), err=err, nl=nl)
