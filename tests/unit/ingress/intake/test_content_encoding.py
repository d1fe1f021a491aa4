"""A webhook body's Content-Encoding, decoded in bounded steps (ingress/intake/content_encoding.py)."""

import gzip
import itertools
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook_ingest.ingress.intake.content_encoding import UndecodableBody, decoder_for

ENCODERS = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "raw deflate": lambda data: (lambda c: c.compress(data) + c.flush())(zlib.compressobj(wbits=-zlib.MAX_WBITS)),
}


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(cut % (len(data) + 1) for cut in cuts)})
    return [data[start:end] for start, end in itertools.pairwise(points)]


def decoded(encoding: str, chunks: list[bytes], room: int) -> bytes:
    decoder = decoder_for(encoding)
    assert decoder is not None
    out = b""
    for chunk in chunks:
        out += decoder.decode(chunk, room - len(out))
        if len(out) >= room:
            return out
    decoder.finish()
    return out


@given(
    members=st.lists(st.binary(max_size=2000), min_size=1, max_size=3),
    kind=st.sampled_from(list(ENCODERS)),
    cuts=st.lists(st.integers(min_value=0), max_size=8),
)
def test_any_body_decodes_whole_however_it_is_cut_into_chunks(members, kind, cuts):
    if kind != "gzip":
        members = members[:1]  # concatenated members are gzip's
    sent = b"".join(ENCODERS[kind](member) for member in members)
    encoding = "gzip" if kind == "gzip" else "deflate"
    assert decoded(encoding, chunked(sent, cuts), room=10**9) == b"".join(members)


@given(
    size=st.integers(min_value=1, max_value=200_000),
    room=st.integers(min_value=1, max_value=100_000),
    cuts=st.lists(st.integers(min_value=0), max_size=4),
)
def test_a_chunk_never_decodes_past_its_room(size, room, cuts):
    out = decoded("gzip", chunked(gzip.compress(b"\0" * size), cuts), room)
    assert len(out) == min(size, room)


@given(sent=st.binary(min_size=1, max_size=200), encoding=st.sampled_from(["gzip", "deflate"]))
def test_a_body_that_is_no_such_stream_or_is_cut_short_is_undecodable(sent, encoding):
    whole = ENCODERS[encoding](sent)
    for body in (b"\xff" + whole, whole[:-1]):
        with pytest.raises(UndecodableBody):
            decoded(encoding, [body], room=10**9)


@pytest.mark.parametrize("value", [None, "", "identity", "x-gzip", "gzip, identity", "compress", "gzïp"])
def test_other_encodings_are_taken_as_sent(value):
    assert decoder_for(value) is None


@pytest.mark.parametrize("value", ["br", "zstd", "BR"])
def test_br_and_zstd_cannot_be_decoded_here(value):
    with pytest.raises(UndecodableBody):
        decoder_for(value)


@pytest.mark.parametrize("value", ["gzip", "GZIP", "deflate", "Deflate"])
def test_gzip_and_deflate_are_decoded_in_any_case(value):
    assert decoder_for(value) is not None
