"""Named SQL blocks loaded from a package's `queries.sql`.

SQL stays SQL — readable, greppable, reviewable — in a file beside the
store that runs it:

    -- name: complete_event
    -- Records the completion, if the fencing token is still current.
    INSERT INTO …

The comment lines around a block (its description, a section heading
before the next name) are for readers of the file: what Postgres gets,
and logs, is the statement alone.

A piece several statements share (a filter) is written once, as a
fragment, and named where it goes by a line of its own:

    -- fragment: archive_filter
    -- What the filter means (for readers, as a statement's description).
    WHERE ($1::text IS NULL OR a.source = $1)
      AND …

    -- name: count_archive
    SELECT count(*) FROM event_archive a
    {{archive_filter}}
      AND a.body IS NOT NULL

The loader expands each `{{name}}` line into the fragment's lines, each
indented as the reference line is, so Postgres receives plain text (the
same text, and plans, as had it been written out) and a fragment is never
a statement of its own. What differs between its users stays in them,
around the reference. A fragment is defined in the same file or in the
`queries.sql` of a package named in `fragments_from` (a concept's own or
one of a lower layer, as its imports); it holds no reference itself, a
reference to a fragment no one defines is an error at load, and a name is
defined once among a file's statements and fragments.

A fragment whose parameters differ between its users names them in its
header, and each reference gives their numbers, in that order:

    -- fragment: held(sources, routes)
    … a.source = ANY($sources::text[]) …

    -- name: search_archive
    {{held($14, $15)}}

Each `$name` of the fragment becomes the reference's number, so Postgres
again receives the text written out; a reference with a different count,
a `$name` the header does not declare, or a parameter it never uses is an
error at load.
"""

import importlib.resources
import re
from collections.abc import Iterable, Mapping
from typing import NamedTuple

_NAME = r"[a-z_][a-z0-9_]*"
_HEADER = re.compile(rf"^-- (name|fragment): ({_NAME})(?:\(([^)\n]*)\))?\s*$", re.MULTILINE)
REFERENCE = re.compile(rf"^([ \t]*)\{{\{{({_NAME})(?:\(([^)\n]*)\))?\}}\}}[ \t]*$", re.MULTILINE)
_NAMED_PARAMETER = re.compile(rf"\$({_NAME})")


class Fragment(NamedTuple):
    """A fragment's text as written and the names of its parameters, in order."""

    text: str
    parameters: tuple[str, ...] = ()

    def filled(self, arguments: tuple[str, ...]) -> str:
        return _NAMED_PARAMETER.sub(lambda named: arguments[self.parameters.index(named[1])], self.text)


def load_queries(package: str, filename: str = "queries.sql", *, fragments_from: Iterable[str] = ()) -> dict[str, str]:
    fragments: dict[str, Fragment] = {}
    for other in fragments_from:
        fragments |= parse_blocks(_read(other, "queries.sql"))[1]
    return parse_queries(_read(package, filename), fragments)


def _read(package: str, filename: str) -> str:
    return importlib.resources.files(package).joinpath(filename).read_text()


def parse_queries(text: str, fragments: Mapping[str, Fragment] | None = None) -> dict[str, str]:
    """The statements of `text`, its references expanded with its own
    fragments and `fragments` (another file's)."""
    statements, own = parse_blocks(text)
    available = {**(fragments or {}), **own}
    return {name: expand(statement, available) for name, statement in statements.items()}


def parse_blocks(text: str) -> tuple[dict[str, str], dict[str, Fragment]]:
    """The statements and the fragments of `text`, as written (unexpanded)."""
    parts = _HEADER.split(text)
    statements: dict[str, str] = {}
    fragments: dict[str, Fragment] = {}
    for kind, name, parameters, body in zip(parts[1::4], parts[2::4], parts[3::4], parts[4::4], strict=True):
        if name in statements or name in fragments:
            raise ValueError(f"query {name!r} is defined twice")
        block = _statement(body)
        if kind == "name":
            if parameters is not None:
                raise ValueError(f"statement {name!r} declares parameters: only a fragment does")
            statements[name] = block
            continue
        if REFERENCE.search(block):
            raise ValueError(f"fragment {name!r} refers to another fragment")
        fragments[name] = _fragment(name, block, parameters)
    return statements, fragments


def _fragment(name: str, text: str, parameters: str | None) -> Fragment:
    declared = _arguments(parameters)
    used = set(_NAMED_PARAMETER.findall(text))
    if not all(re.fullmatch(_NAME, parameter) for parameter in declared) or len(set(declared)) != len(declared):
        raise ValueError(f"fragment {name!r} declares its parameters as ({parameters})")
    if used != set(declared):
        raise ValueError(f"fragment {name!r} declares ({parameters or ''}) but uses {sorted(used)}")
    return Fragment(text, declared)


def _arguments(listed: str | None) -> tuple[str, ...]:
    return () if not listed else tuple(part.strip() for part in listed.split(","))


def expand(statement: str, fragments: Mapping[str, Fragment]) -> str:
    def fragment(reference: re.Match[str]) -> str:
        indent, name, listed = reference.groups()
        if name not in fragments:
            raise ValueError(f"fragment {name!r} is not defined")
        arguments = _arguments(listed)
        if len(arguments) != len(fragments[name].parameters) or not all(
            re.fullmatch(r"\$\d+", argument) for argument in arguments
        ):
            raise ValueError(
                f"fragment {name!r} takes ({', '.join(fragments[name].parameters)}), given ({listed or ''})"
            )
        text = fragments[name].filled(arguments)
        return "\n".join(indent + line if line else line for line in text.splitlines())

    expanded = REFERENCE.sub(fragment, statement)
    if "{{" in expanded:
        raise ValueError(f"a fragment's reference not on a line of its own: {statement[:60]!r}…")
    return expanded


def _statement(body: str) -> str:
    lines = body.strip().splitlines()
    while lines and _is_comment(lines[0]):
        lines.pop(0)
    while lines and _is_comment(lines[-1]):
        lines.pop()
    return "\n".join(lines).strip()


def _is_comment(line: str) -> bool:
    return not line.strip() or line.lstrip().startswith("--")
