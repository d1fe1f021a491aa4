"""What the ingress refuses as unstorable JSON, against the real Postgres's
verdict on the same text (`SELECT $1::jsonb`)."""

import asyncio
import json
import math
import re
from dataclasses import dataclass

import asyncpg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import SERVER_URL
from webhook_ingest.shared import storable_json


@pytest.fixture(scope="module")
def jsonb_accepts():
    """Postgres's verdict: does `$1::jsonb` take this text?"""
    loop = asyncio.new_event_loop()
    connection = loop.run_until_complete(asyncpg.connect(SERVER_URL))

    def accepts(text: str) -> bool:
        try:
            loop.run_until_complete(connection.fetchval("SELECT $1::jsonb IS NOT NULL", text))
        except asyncpg.PostgresError:
            return False
        return True

    yield accepts
    loop.run_until_complete(connection.close())
    loop.close()


def we_accept(body: bytes) -> bool:
    try:
        storable_json.parse(body)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Number:
    literal: str

    @property
    def beyond_float(self) -> bool:
        return lost_by_float(self.literal)


def lost_by_float(literal: str) -> bool:
    """Beyond a 64-bit float either way: infinite, or nonzero read as 0.0."""
    value = float(literal)
    mantissa = literal.lower().partition("e")[0]
    return not math.isfinite(value) or (value == 0.0 and any(digit in mantissa for digit in "123456789"))


EDGE_EXPONENTS = [308, 309, 400, 16383, 16384, 131071, 131072, -16383, -16384, 2**30 - 2, 2**30 - 1, -(2**30 - 1)]
exponents = st.one_of(
    st.integers(-30, 30),
    st.sampled_from(EDGE_EXPONENTS),
    st.integers(-200_000, 200_000),
    st.sampled_from(EDGE_EXPONENTS).map(lambda e: e - 1),
)
integer_parts = st.one_of(st.just("0"), st.integers(1, 10**12).map(str), st.just("1" + "0" * 40))
numbers = st.builds(
    lambda sign, integer, fraction, exponent, letter: Number(
        f"{sign}{integer}{'.' + fraction if fraction else ''}{letter + str(exponent) if letter else ''}"
    ),
    st.sampled_from(["", "-"]),
    integer_parts,
    st.text("0123456789", max_size=6),
    exponents,
    st.sampled_from(["", "e", "E", "e+"]),
)
# numbers exactly at numeric's edges: 16383 digits after the point, the
# leading digit at 10^131071, an exponent literal of 2^30 - 1
scale_edges = st.builds(
    lambda fraction, delta: Number(f"1.{fraction}e{len(fraction) - 16383 + delta}"),
    st.text("0123456789", min_size=1, max_size=4),
    st.integers(-1, 1),
)
weight_edges = st.builds(
    lambda integer, delta: Number(f"0.{integer}e{131072 + delta}"), st.integers(1, 10**6).map(str), st.integers(-1, 1)
)
exponent_edges = st.builds(
    lambda digit, delta: Number(f"{digit}e{2**30 - 1 + delta}"), st.sampled_from("01"), st.integers(-1, 0)
)
numbers = st.one_of(numbers, scale_edges, weight_edges, exponent_edges)
constants = st.sampled_from([Number("NaN"), Number("Infinity"), Number("-Infinity")])
strings = st.one_of(st.text(), st.text(st.characters(blacklist_categories=("Cs",))).map(lambda s: ("raw", s)))
scalars = st.one_of(st.none(), st.booleans(), numbers, constants, strings)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.lists(st.tuples(strings, children), max_size=4).map(dict)
    ),
    max_leaves=12,
)


def render(value) -> str:
    """JSON text with every number written exactly as generated."""
    if isinstance(value, Number):
        return value.literal
    if isinstance(value, tuple):  # ("raw", text): not ASCII-escaped
        return json.dumps(value[1], ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ",".join(map(render, value)) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{render(k)}:{render(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def beyond_float(value) -> bool:
    if isinstance(value, Number):
        return value.literal[-1].isdigit() and value.beyond_float
    if isinstance(value, list):
        return any(map(beyond_float, value))
    if isinstance(value, dict):
        return any(map(beyond_float, value.values()))
    return False


@settings(max_examples=400, deadline=None)
@given(values)
def test_we_refuse_exactly_what_jsonb_refuses_and_floats_beyond_64_bits(jsonb_accepts, value):
    text = render(value)
    assert we_accept(text.encode()) == (jsonb_accepts(text) and not beyond_float(value)), text[:300]


CORPUS = [
    r'{"id":"e1","t":"\ud83d"}',
    r'{"t":"\udc00x"}',
    r'{"t":"\u0000"}',
    r'{"\u0000":1}',
    r'{"t":"\\u0000"}',
    r'{"t":"\ud83d\ude00"}',
    '{"n":1e400}',
    '{"n":-1e400}',
    '{"n":1e308}',
    '{"n":1e-400}',
    '{"n":1e-16384}',
    '{"n":0e-20000}',
    '{"n":0e999999999}',
    '{"n":NaN}',
    '{"n":-Infinity}',
    '{"a":1}\n',
    '\ufeff{"a":1}',
    '{"a":' + "[" * 511 + "]" * 511 + "}",
    '{"a":"\x01"}',
    '{"n":1e131071}',
    '{"n":1e131072}',
    '{"n":0.1e131072}',
    '{"n":0e1073741822}',
    '{"n":0e1073741823}',
    '{"n":0e-1073741823}',
    '{"n":1.0e-16383}',
    '{"n":0.0000001e-16376}',
]


@pytest.mark.parametrize("text", CORPUS, ids=lambda text: text[:30])
def test_a_fixed_corpus_agrees_with_jsonb(jsonb_accepts, text):
    within_float = not any(map(lost_by_float, re.findall(r"(?<=:)-?[0-9][0-9.eE+-]*", text)))
    assert we_accept(text.encode()) == (jsonb_accepts(text) and within_float), text


def test_what_postgres_would_take_but_we_refuse_too():
    assert not we_accept(b'{"a":' + b"[" * 512 + b"]" * 512 + b"}")  # 513 levels
    assert not we_accept(b"[" * 100_000 + b"]" * 100_000)
    assert not we_accept('{"a":1}'.encode("utf-16"))  # json.loads itself would take it
    assert not we_accept(b'{"n":' + b"9" * 4301 + b"}")  # Python's int() refuses more than 4300 digits
    assert we_accept(b'{"a":' + b"[" * 511 + b"]" * 511 + b"}")
