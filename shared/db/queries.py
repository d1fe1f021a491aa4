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
"""

import importlib.resources
import re
from collections.abc import Iterable, Mapping

_HEADER = re.compile(r"^-- (name|fragment): ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
REFERENCE = re.compile(r"^([ \t]*)\{\{([a-z_][a-z0-9_]*)\}\}[ \t]*$", re.MULTILINE)


def load_queries(package: str, filename: str = "queries.sql", *, fragments_from: Iterable[str] = ()) -> dict[str, str]:
    fragments: dict[str, str] = {}
    for other in fragments_from:
        fragments |= parse_blocks(_read(other, "queries.sql"))[1]
    return parse_queries(_read(package, filename), fragments)


def _read(package: str, filename: str) -> str:
    return importlib.resources.files(package).joinpath(filename).read_text()


def parse_queries(text: str, fragments: Mapping[str, str] | None = None) -> dict[str, str]:
    """The statements of `text`, its references expanded with its own
    fragments and `fragments` (another file's)."""
    statements, own = parse_blocks(text)
    available = {**(fragments or {}), **own}
    return {name: expand(statement, available) for name, statement in statements.items()}


def parse_blocks(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """The statements and the fragments of `text`, as written (unexpanded)."""
    parts = _HEADER.split(text)
    statements: dict[str, str] = {}
    fragments: dict[str, str] = {}
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3]):
        if name in statements or name in fragments:
            raise ValueError(f"query {name!r} is defined twice")
        block = _statement(body)
        if kind == "fragment" and REFERENCE.search(block):
            raise ValueError(f"fragment {name!r} refers to another fragment")
        (statements if kind == "name" else fragments)[name] = block
    return statements, fragments


def expand(statement: str, fragments: Mapping[str, str]) -> str:
    def fragment(reference: re.Match[str]) -> str:
        indent, name = reference.groups()
        if name not in fragments:
            raise ValueError(f"fragment {name!r} is not defined")
        return "\n".join(indent + line if line else line for line in fragments[name].splitlines())

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
