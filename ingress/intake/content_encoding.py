"""A webhook body's `Content-Encoding`, decoded here and not by aiohttp.

aiohttp decodes gzip and deflate bodies for every request as they arrive,
whoever reads them: also while it drains the body of a request answered
early (unknown source, allowlist, failure budget: up to 10 s of "lingering"
after the answer), so 0.5 MB of gzip sent to an unknown source cost ~0.35 s
of the event loop, and nothing was charged to the client. The ingress runs
with `auto_decompress=False`; a webhook's body is decoded by `BodyDecoder`,
only once its headers are vetted and its slot taken, and never past the
source's `max_body_bytes`: what arrives encoded and what it decodes to are
both bounded by it. Every other route reads bodies as sent.

The encodings are aiohttp's: `gzip` (concatenated members too) and
`deflate` (zlib-wrapped, or raw as some senders write it); `br` and
`zstd`, which aiohttp would try, cannot be decoded here. Any other value is
no encoding aiohttp knew, and the body is taken as sent, as before.
"""

import zlib

DECODED = frozenset({"gzip", "deflate"})
UNDECODABLE = frozenset({"br", "zstd"})


class UndecodableBody(ValueError):
    """The body does not decode in its Content-Encoding."""


class BodyDecoder:
    """Decodes a body chunk by chunk, at most `room` bytes per chunk: the
    caller stops (413) once a chunk fills its room, before decoding more."""

    def __init__(self, encoding: str):
        self._encoding = encoding
        self._stream: zlib._Decompress | None = None

    def decode(self, chunk: bytes, room: int) -> bytes:
        pieces = []
        try:
            while chunk and room > 0:
                stream = self._next_stream(chunk)
                piece = stream.decompress(chunk, room)
                pieces.append(piece)
                room -= len(piece)
                chunk = stream.unused_data if stream.eof else stream.unconsumed_tail
        except zlib.error as exc:
            raise UndecodableBody(f"not {self._encoding}: {exc}") from None
        return b"".join(pieces)

    def finish(self) -> None:
        """UndecodableBody when the body ended inside a stream."""
        if self._stream is not None and not self._stream.eof:
            raise UndecodableBody(f"the {self._encoding} stream is cut short")

    def _next_stream(self, chunk: bytes) -> "zlib._Decompress":
        """The stream `chunk` continues, or a new one (the first, or a gzip member after another)."""
        if self._stream is None or self._stream.eof:
            self._stream = zlib.decompressobj(_window_bits(self._encoding, chunk))
        return self._stream


def decoder_for(content_encoding: str | None) -> BodyDecoder | None:
    """The body's decoder; None when it is taken as sent. UndecodableBody for br and zstd."""
    encoding = (content_encoding or "").lower() if (content_encoding or "").isascii() else ""
    if encoding in UNDECODABLE:
        raise UndecodableBody(f"{encoding} bodies cannot be decoded here")
    return BodyDecoder(encoding) if encoding in DECODED else None


def _window_bits(encoding: str, first: bytes) -> int:
    if encoding == "gzip":
        return 16 + zlib.MAX_WBITS
    # RFC 1950's first byte names the method (8, deflate) in its low bits; without it, raw deflate.
    return zlib.MAX_WBITS if first[0] & 0x0F == 8 else -zlib.MAX_WBITS
