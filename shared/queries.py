"""Named SQL blocks loaded from a package's `queries.sql`.

SQL stays SQL — readable, greppable, reviewable — in one file per package:

    -- name: complete_event
    -- Records the completion, if the fencing token is still current.
    INSERT INTO …
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
        queries[name] = body.strip()
    return queries
