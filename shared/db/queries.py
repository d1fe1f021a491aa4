"""Named SQL blocks loaded from a package's `queries.sql`.

SQL stays SQL — readable, greppable, reviewable — in one file per package:

    -- name: complete_event
    -- Records the completion, if the fencing token is still current.
    INSERT INTO …

The comment lines around a block (its description, a section heading
before the next name) are for readers of the file: what Postgres gets,
and logs, is the statement alone.
"""

import importlib.resources
import re

_HEADER = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def load_queries(package: str, filename: str = "queries.sql") -> dict[str, str]:
    text = importlib.resources.files(package).joinpath(filename).read_text()
    return parse_queries(text)


def parse_queries(text: str) -> dict[str, str]:
    parts = _HEADER.split(text)
    queries = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = _statement(body)
    return queries


def _statement(body: str) -> str:
    lines = body.strip().splitlines()
    while lines and _is_comment(lines[0]):
        lines.pop(0)
    while lines and _is_comment(lines[-1]):
        lines.pop()
    return "\n".join(lines).strip()


def _is_comment(line: str) -> bool:
    return not line.strip() or line.lstrip().startswith("--")
