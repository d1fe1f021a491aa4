"""JSON that every part of the pipeline can hold exactly: Postgres `jsonb`
(the inbox, the dead letters), Python's float (the payload handed to a
handler, the canonical hash) and UTF-8 text.

Python's `json.loads` accepts more than `jsonb` does, and what it accepts
and `jsonb` refuses would be answered 200 and then fail in every worker and
in the dead-letter insert. So the ingress parses a body with `parse` and
refuses (400 `invalid_json`) what any of them cannot hold:

- a body that is not UTF-8 (`json.loads` on bytes also takes UTF-16/32),
- `NaN`, `Infinity`, `-Infinity` (not JSON),
- a `\\u0000` escape or an unpaired surrogate escape such as `"\\ud83d"`
  (a sender cutting an emoji in half) anywhere in a string or a key,
- a number beyond a 64-bit float (1e400: a handler would read `inf`, and
  1e400 and 1e401 would hash alike; this also covers numeric's limit of
  131072 digits before the decimal point), or a nonzero one below its
  smallest (1e-400: a handler would read 0.0, and 1e-400 and 2e-400 would
  hash alike), or one `numeric` cannot hold:
  more than 16383 digits after the point (counting the exponent: 1e-16384,
  even 0e-20000), or an exponent written as 2^30 - 1 or more,
- nesting deeper than `MAX_DEPTH`, where Python's parser and the hash
  would run out of stack.

The check costs almost nothing on the usual body: strings are only walked
when the text holds a `\\u` escape, depth only counted when it holds more
brackets than `MAX_DEPTH`, and numbers are checked by the parser's own hook.
"""

import itertools
import json
import math
import re
from typing import NoReturn

MAX_DEPTH = 512

# numeric's limits (Postgres src/backend/utils/adt/numeric.c)
_MAX_EXPONENT_LITERAL = 2**30 - 1  # INT_MAX / 2: refused before anything else
_MAX_DISPLAY_SCALE = 16383

_NUMBER = re.compile(r"-?(\d+)(?:\.(\d+))?(?:[eE]([-+]?\d+))?")
_UNSTORABLE_CHARACTER = re.compile("[\x00\ud800-\udfff]")
_NONZERO_DIGIT = re.compile("[1-9]")


class NotStorable(ValueError):
    """Valid to Python's parser, but not JSON every store can hold."""


def parse(body: bytes) -> object:
    """The parsed body; ValueError when it is not JSON, or not storable."""
    return parse_noting_floats(body)[0]


def parse_noting_floats(body: bytes) -> tuple[object, bool]:
    """`parse`, and whether the body held a float (a number with a fraction or an
    exponent): without one, orjson writes its canonical JSON (shared/event/ids.py)."""
    floats_before = next(_FLOATS_PARSED)
    try:
        text = body.decode("utf-8")
        value = _DECODER.decode(text)
    except RecursionError as exc:
        raise NotStorable("nested too deeply") from exc
    if "\\u" in text or body.count(b"[") + body.count(b"{") > MAX_DEPTH:
        _check_tree(value)
    return value, next(_FLOATS_PARSED) != floats_before + 1


# Counted by `_float` (and by each parse before and after itself: next() is atomic, so a float
# another thread parses meanwhile can only make a parse think it held one).
_FLOATS_PARSED = itertools.count()


def _float(literal: str) -> float:
    """parse_float: every number with a fraction or an exponent comes here
    (integers need no check: Python refuses those of more than 4300 digits)."""
    next(_FLOATS_PARSED)
    value = float(literal)
    if not math.isfinite(value):
        raise NotStorable(f"{literal[:20]} is beyond a 64-bit float")
    if value == 0.0 and _NONZERO_DIGIT.search(literal.lower().partition("e")[0]):
        raise NotStorable(f"{literal[:20]} is below the smallest 64-bit float")
    short_without_exponent = len(literal) <= _MAX_DISPLAY_SCALE and "e" not in literal and "E" not in literal
    if not (short_without_exponent or numeric_accepts(literal)):
        raise NotStorable(f"{literal[:20]} is beyond Postgres numeric")
    return value


def numeric_accepts(literal: str) -> bool:
    """Would Postgres `numeric` (and so `jsonb`) take this JSON number, given
    that it is within a float's range? (Its display scale: the digits after
    the point, trailing zeros included, less the exponent.)"""
    number = _NUMBER.fullmatch(literal)
    if number is None:  # not a JSON number at all
        return False
    _, fraction, exponent_text = number.groups()
    exponent = int(exponent_text or 0)
    return abs(exponent) < _MAX_EXPONENT_LITERAL and len(fraction or "") - exponent <= _MAX_DISPLAY_SCALE


def _refuse_constant(name: str) -> NoReturn:
    raise NotStorable(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_float=_float, parse_constant=_refuse_constant)  # built once, not per body


def _check_tree(value: object) -> None:
    """Iteratively (a recursive walk would hit the very limit it checks):
    no unstorable character in a string or key, no nesting past MAX_DEPTH."""
    pending = [(value, 1)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, str):
            if _UNSTORABLE_CHARACTER.search(node):
                raise NotStorable("a \\u0000 or unpaired surrogate escape")
            continue
        if not isinstance(node, (dict, list)):
            continue
        if depth > MAX_DEPTH:
            raise NotStorable(f"nested deeper than {MAX_DEPTH}")
        if isinstance(node, dict):
            pending.extend((key, depth) for key in node)
            pending.extend((item, depth + 1) for item in node.values())
        else:
            pending.extend((item, depth + 1) for item in node)
