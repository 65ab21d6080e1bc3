"""fiomon.fio.decode: compression and text encodings undone chunk by chunk (hand-made bytes)."""

from __future__ import annotations

import bz2
import codecs
import gzip
import lzma
import zlib

import pytest

from fiomon.fio.decode import InputDecoder, container, fio_log_store, text_form

TEXT = b"1795000000000, 0, 4096, 0, 1, 2\n" * 200 + b'{"fio version": "fio-3.33"}\n'


def decode_all(data: bytes, piece: int) -> tuple[bytes, InputDecoder]:
    dec = InputDecoder(data[:4096])
    out = b"".join(b for i in range(0, len(data), piece) for b in dec.feed(data[i : i + piece]))
    return out + b"".join(dec.finish()), dec


@pytest.mark.parametrize(
    ("encode", "form"),
    [
        (gzip.compress, "gzip"),
        (bz2.compress, "bzip2"),
        (lzma.compress, "xz"),
        (lambda b: gzip.compress(b[:100]) + gzip.compress(b[100:]), "gzip"),  # cat a.gz b.gz
        (lambda b: codecs.BOM_UTF8 + b, "plain"),
        (lambda b: codecs.BOM_UTF16_LE + b.decode().encode("utf-16-le"), "plain"),
        (lambda b: b.decode().encode("utf-16-be"), "plain"),  # no BOM: NULs tell
        (lambda b: gzip.compress(codecs.BOM_UTF16_LE + b.decode().encode("utf-16-le")), "gzip"),
    ],
)
@pytest.mark.parametrize("piece", [1, 7, 4096, 1 << 20])
def test_every_form_decodes_to_the_same_utf8_in_any_pieces(
    encode: object, form: str, piece: int
) -> None:
    data = encode(TEXT)  # type: ignore[operator]
    assert container(data) == form
    out, dec = decode_all(data, piece)
    assert out == TEXT
    assert dec.error is None


def test_plain_utf8_needs_no_decoder() -> None:
    assert not InputDecoder(TEXT).needed
    assert text_form(TEXT) == "utf-8"


def test_corrupt_or_cut_compressed_data_sets_an_error_not_an_exception() -> None:
    data = gzip.compress(TEXT)
    _, dec = decode_all(data[: len(data) // 2], 100)
    assert dec.error is not None
    assert "truncated" in dec.error
    _, dec = decode_all(data[:10] + b"\xff" * 50 + data[60:], 100)
    assert dec.error is not None


def test_a_compression_bomb_comes_out_in_bounded_pieces() -> None:
    data = gzip.compress(b"0, " * (20 << 20))
    dec = InputDecoder(data)
    sizes = [len(p) for p in dec.feed(data)]
    assert max(sizes) <= 4 << 20
    assert sum(sizes) == 3 * (20 << 20)


def test_fio_log_store_is_a_zlib_stream_text_is_not() -> None:
    assert fio_log_store(zlib.compress(b"\x00" * 1000))
    assert not fio_log_store(b"x^2 is not a log\n")
    assert not fio_log_store(TEXT)
    assert not fio_log_store(gzip.compress(TEXT))
