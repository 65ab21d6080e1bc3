"""The bytes of a fio output file as the parsers read them: UTF-8, uncompressed.

fio writes UTF-8 (ASCII in practice), but its outputs reach fiomon in other forms:

* compressed after the run (``gzip``, ``bzip2``, ``xz``): recognised by their magic bytes,
  never by the name, and decompressed incrementally;
* with a UTF-8 byte-order mark, or in UTF-16 (Windows PowerShell's ``>`` writes UTF-16 LE
  with a BOM): the BOM is dropped and UTF-16 is transcoded to UTF-8.

:func:`container` names the form from a file's first bytes; :class:`InputDecoder` undoes
it chunk by chunk (each output piece at most :data:`PIECE_BYTES`, so a small compressed
chunk that expands a thousandfold never lands in memory at once). A plain UTF-8 file needs
no decoder: callers skip this layer entirely then (the hot path stays as it was).

fio's own ``log_store_compressed=1`` logs (``.fz``) are zlib streams of fio's in-memory
sample structs, not text: :func:`fio_log_store` recognises them so that the caller can
refuse them with a useful message (``fio --inflate-log``).
"""

from __future__ import annotations

import bz2
import codecs
import lzma
import zlib
from collections.abc import Iterator
from typing import Literal, Protocol

Container = Literal["plain", "gzip", "bzip2", "xz"]
TextForm = Literal["utf-8", "utf-8-bom", "utf-16-le", "utf-16-be"]

_TEXT_NAMES = {
    "utf-8": "UTF-8",
    "utf-8-bom": "UTF-8 with BOM",
    "utf-16-le": "UTF-16 LE",
    "utf-16-be": "UTF-16 BE",
}
PIECE_BYTES = 4 << 20  # largest decompressed piece handed on at once
_MAGIC: tuple[tuple[bytes, Container], ...] = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
)


def container(head: bytes) -> Container:
    """The compression of a file whose first bytes are ``head`` (``plain``: none)."""
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    return "plain"


def fio_log_store(head: bytes) -> bool:
    """Whether ``head`` starts a zlib stream, as fio's ``log_store_compressed`` files do.

    A zlib header is two bytes, ``0x78`` (deflate, 32 KiB window) then a flag byte making
    the pair a multiple of 31, and the deflate data after it must inflate; no fio text
    output or log starts that way.
    """
    if len(head) < 2 or head[0] != 0x78 or (head[0] * 256 + head[1]) % 31:
        return False
    try:  # and what follows inflates (text starting "x^" does not)
        zlib.decompressobj().decompress(head[:4096], 64)
    except zlib.error:
        return False
    return True


def text_form(head: bytes) -> TextForm:
    """The text encoding of decompressed bytes starting with ``head``.

    A BOM decides; without one, UTF-16 shows as a NUL in every other byte of the first
    characters (fio's text is ASCII).
    """
    if head.startswith(codecs.BOM_UTF8):
        return "utf-8-bom"
    if head.startswith(codecs.BOM_UTF16_LE):
        return "utf-16-le"
    if head.startswith(codecs.BOM_UTF16_BE):
        return "utf-16-be"
    pairs = head[:64]
    if len(pairs) >= 8 and len(pairs) % 2 == 0:
        if not any(pairs[1::2]) and all(pairs[0::2]):
            return "utf-16-le"
        if not any(pairs[0::2]) and all(pairs[1::2]):
            return "utf-16-be"
    return "utf-8"


class _Decompressor(Protocol):
    @property
    def eof(self) -> bool: ...
    @property
    def unused_data(self) -> bytes: ...
    @property
    def needs_input(self) -> bool: ...
    def decompress(self, data: bytes, max_length: int = -1) -> bytes: ...


class _Zlib:
    """``zlib.decompressobj`` (gzip) with the ``needs_input`` of the bz2 and lzma ones."""

    def __init__(self) -> None:
        self._d = zlib.decompressobj(wbits=31)

    @property
    def eof(self) -> bool:
        return self._d.eof

    @property
    def unused_data(self) -> bytes:
        return self._d.unused_data

    @property
    def needs_input(self) -> bool:
        return not self._d.unconsumed_tail

    def decompress(self, data: bytes, max_length: int = -1) -> bytes:
        data = self._d.unconsumed_tail + data
        return self._d.decompress(data, max(0, max_length))


def _decompressor(kind: Container) -> _Decompressor:
    if kind == "gzip":
        return _Zlib()
    if kind == "bzip2":
        return bz2.BZ2Decompressor()
    return lzma.LZMADecompressor(format=lzma.FORMAT_XZ)


class InputDecoder:
    """Undo compression and text encoding of a file, chunk by chunk.

    Args:
        head: the file's first bytes (at least a few; the form is fixed from them).

    :attr:`error` is set (and no more output comes) when the compressed data is corrupt;
    :attr:`description` says what the file is for messages (``gzip, UTF-16 LE``).
    """

    def __init__(self, head: bytes) -> None:
        self.container: Container = container(head)
        self.text: TextForm | None = None if self.container != "plain" else text_form(head)
        self.error: str | None = None
        self._dec: _Decompressor | None = (
            None if self.container == "plain" else _decompressor(self.container)
        )
        self._text_head = b""
        self._codec: codecs.IncrementalDecoder | None = None
        self._skip = 3 if self.text == "utf-8-bom" else 0  # BOM bytes still to drop
        self._bom16 = head[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)

    @property
    def needed(self) -> bool:
        """Whether the file needs decoding at all (else its bytes are already UTF-8)."""
        return self.container != "plain" or self.text != "utf-8"

    @property
    def description(self) -> str:
        """The form, for messages."""
        parts: list[str] = [] if self.container == "plain" else [self.container]
        if self.text is not None and self.text != "utf-8":
            parts.append(_TEXT_NAMES[self.text])
        return ", ".join(parts) or "UTF-8"

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The UTF-8 pieces ``data`` completes (each at most :data:`PIECE_BYTES`)."""
        if self.error is not None:
            return
        if self._dec is None:
            yield from self._text(data, final=False)
            return
        try:
            yield from self._decompress(data)
        except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as exc:
            self.error = f"corrupt {self.container} data ({exc})"

    def finish(self) -> Iterator[bytes]:
        """The last pieces at the end of the file."""
        if self.error is None and self._dec is not None and not self._dec.eof:
            self.error = f"{self.container} data ends early (truncated?)"
        yield from self._text(b"", final=True)

    def _decompress(self, data: bytes) -> Iterator[bytes]:
        dec = self._dec
        assert dec is not None  # noqa: S101 -- only called with a decompressor
        while True:
            if dec.eof:
                rest = dec.unused_data + data
                if not rest.strip(b"\0"):
                    return  # trailing padding (tar, dd)
                # Concatenated members (``cat a.gz b.gz``, pbzip2): a new decompressor each.
                dec = self._dec = _decompressor(self.container)
                data = rest
            out = dec.decompress(data, PIECE_BYTES)
            data = b""
            if out:
                yield from self._text(out, final=False)
            if dec.needs_input and not dec.eof:
                return

    def _text(self, data: bytes, *, final: bool) -> Iterator[bytes]:
        if self.text is None:  # decompressed text: its form comes from its first bytes
            self._text_head += data
            if len(self._text_head) < 64 and not final:
                return
            data, self._text_head = self._text_head, b""
            self.text = text_form(data)
            self._skip = 3 if self.text == "utf-8-bom" else 0
            self._bom16 = data[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
        if self.text in ("utf-8", "utf-8-bom"):
            cut = min(self._skip, len(data))
            self._skip -= cut
            if data[cut:]:
                yield data[cut:]
            return
        if self._codec is None:
            # "utf-16" reads and drops the BOM; the explicit ones are for BOM-less text.
            name = "utf-16" if self._bom16 else self.text
            self._codec = codecs.getincrementaldecoder(name)(errors="replace")
        out = self._codec.decode(data, final)
        if out:
            yield out.encode("utf-8")
