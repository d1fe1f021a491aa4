"""Text that every store and every log line can hold, whatever a handler's
error said: Postgres `text` and `jsonb` refuse a NUL, and UTF-8 — Postgres,
orjson, so our JSON log lines — a lone surrogate (bytes decoded with
errors="surrogateescape", as os and subprocess hand them over). Each becomes
U+FFFD: an error message is for reading, and one that cannot be written
would stop the dead letter, the incident or the log line that carries it.
"""

import re

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(text: str) -> str:
    """`text`, each NUL and each lone surrogate made U+FFFD."""
    return _UNSTORABLE.sub("\ufffd", text)


def cleaned(value: object) -> object:
    """`value` with every string in it (keys too, in dicts, lists and tuples) `storable`."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, dict):
        return {cleaned(str(key)): cleaned(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [cleaned(item) for item in value]
    return value
