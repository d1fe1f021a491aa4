"""A source's `retention` (docs/reference.md §3): how long the archive keeps
its events, as the sources file writes it (`30d`, `12h`, `0d`: not archived).

A setting of the sources file, read where the file is read; the archive
only receives the parsed `timedelta` (`shared/archive/model.py` `kept_days`).
"""

import re
from datetime import timedelta

DEFAULT_RETENTION = timedelta(days=7)
_DURATION = re.compile(r"(\d{1,6})([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_retention(text: str) -> timedelta:
    """`30d`, `12h`, `90m`, `3600s`; `0d` is "not archived". ValueError otherwise."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a duration such as 30d, 12h or 0d (not archived)")
    return timedelta(seconds=int(match[1]) * _UNIT_SECONDS[match[2]])
