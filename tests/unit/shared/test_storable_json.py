"""`storable_json.parse_noting_floats`: whether a body held a float, which lets
its canonical JSON be written by orjson (shared/event/ids.py)."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook_ingest.shared import storable_json


@pytest.mark.parametrize(
    ("body", "held_a_float"),
    [
        (b'{"a": 1, "b": [2, -3, {"c": 10000000000000000000000}], "d": "1.5e7"}', False),
        (b'{"a": "x", "b": [1, {"c": 1.5}]}', True),
        (b'{"a": 1E5}', True),
        (b'{"a": -0.0}', True),
        (b'{"a": true, "b": null}', False),
    ],
)
def test_a_parse_notes_whether_the_body_held_a_float(body, held_a_float):
    assert storable_json.parse_noting_floats(body) == (json.loads(body), held_a_float)


@given(
    st.recursive(st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text("ab.1e")), st.lists)
)
def test_a_float_anywhere_is_noted(value):
    body = json.dumps({"v": value}).encode()
    assert storable_json.parse_noting_floats(body)[1] == _has_float(value)


def _has_float(value) -> bool:
    return isinstance(value, float) or (isinstance(value, list) and any(map(_has_float, value)))
