"""The one rule for recognising fio's outputs by content, and the parser interface.

fio writes three kinds of histogram output that fiomon reads: the json+ status stream
(``--output-format=json+`` with ``--status-interval``), hist logs (``log_hist_msec``), and
the hist logs a ``fio --client`` run writes (the server's address appended to the name,
every record counted as often as jobs have run before it: :mod:`fiomon.fio.clientlog`).
A file's first bytes tell json+ from a hist log (:func:`sniff`); :func:`open_parser`
builds the matching :class:`RecordParser`, which the agent's follower and the offline
sources feed alike.

Recognition is by content, on the first :data:`SNIFF_BYTES` of the file, after undoing
compression (gzip, bzip2, xz) and text encoding (UTF-8 BOM, UTF-16) with
:mod:`fiomon.fio.decode`:

* ``{`` first, or a line opening a fio document (``{`` then ``"fio version"``, ``"jobs"``,
  ``"client_stats"``, ...) anywhere in the head: a json+ stream (fio's ``note:`` lines on
  stdout, ``--output-format=json+,normal``, pbench's ``fio-result.txt``);
* a digit first: a hist log (the hist-log parser refuses fio's lat/bw/iops logs);
* other text first: a json+ stream too (fio's text may run past the head before its
  first document; a file that never holds one is refused at its end);
* binary bytes: a hist log, whose parser reports them; fio's ``log_store_compressed``
  store (``.fz``): refused.

A refused file is never read as something else: its parser reports one problem of kind
``refused`` and keeps :attr:`RecordParser.refusal`, a message naming what the file is and
the fio option that writes a readable one; the offline report turns it into an error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from fiomon.bins import BinLayout
from fiomon.fio.clientlog import ClientLogUndo, client_log_host
from fiomon.fio.decode import InputDecoder, fio_log_store
from fiomon.fio.fiojson import MAX_DOCUMENT_BYTES, JsonStatusParser
from fiomon.fio.fiolog import HistLogOptions, HistLogParser, TimeKind
from fiomon.fio.problems import ProblemLog
from fiomon.model import LatencyKind, RecordBatch

Kind = Literal["json", "hist"]


class RecordParser(Protocol):
    """An incremental parser of one fio output file: bytes in, record batches out."""

    @property
    def kind(self) -> Kind:
        """``json`` (a json+ status stream) or ``hist`` (a hist log)."""

    @property
    def layout(self) -> BinLayout | None:
        """The bin layout of its records, once known."""

    @property
    def time_kind(self) -> TimeKind | None:
        """``epoch`` or ``relative`` stamps, once records came (json+ is always epoch)."""

    @property
    def slack_ms(self) -> int:
        """How far a later record may start before the latest end seen, ms."""

    def feed(self, data: bytes) -> RecordBatch | None:
        """Parse the next bytes of the file; the records they completed, if any."""

    def finish(self) -> RecordBatch | None:
        """The file ended: the records still held back."""

    @property
    def refusal(self) -> str | None:
        """Why the file cannot be read as fio histograms (what it is, what fixes it), or None."""


SNIFF_BYTES = 4096  # how much of a file's head every reader hands to sniff (agent, offline)
_SNIFF_TEXT_BYTES = 64 << 10  # decoded head looked at (a compressed head expands)
# A line opening one of fio's JSON documents (json, json+, --client).
_DOC_START = re.compile(
    rb'(?:^|\n)[ \t]*\{\s*"(?:fio version|jobs|client_stats|global options|timestamp)"'
)


def _decoded_head(head: bytes) -> tuple[bytes, InputDecoder | None]:
    """``head`` as UTF-8 text, and the decoder the file needs (None: it is UTF-8 already)."""
    dec = InputDecoder(head)
    if not dec.needed:
        return head, None
    out = b""
    probe = InputDecoder(head)
    for piece in probe.feed(head):
        out += piece[: _SNIFF_TEXT_BYTES - len(out)]
        if len(out) >= _SNIFF_TEXT_BYTES:
            break
    if not out:  # fewer decoded bytes than decide a text form: take what there is
        out = b"".join(probe.finish())[:_SNIFF_TEXT_BYTES]
    return out, dec


def _classify(text: bytes) -> Kind | None:
    """``json`` or ``hist`` for decoded head bytes (see the module docstring)."""
    first = text.lstrip()[:1]
    if not first:
        return None
    if first == b"{" or _DOC_START.search(text):
        return "json"
    if first.isdigit():
        return "hist"
    line = text.lstrip().split(b"\n", 1)[0][:512]
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(line) - 3:  # not just a character cut at the end
            return "hist"  # binary: the hist-log parser reports it line by line
    return "hist" if b"\0" in line else "json"


def sniff(head: bytes) -> Kind | None:
    """``json`` or ``hist`` from a file's first bytes (None while it holds only blanks).

    Works on any prefix of a growing file: a head holding only fio's text so far (its
    ``note:`` lines) is a json+ stream, since no hist log starts with text.
    """
    if not head.strip():
        return None
    if fio_log_store(head):
        return "hist"  # refused by its parser
    text, _ = _decoded_head(head)
    return _classify(text)


def fio_json_head(head: bytes) -> bool:
    """Whether a file's first bytes hold the start of a fio JSON document (json, json+)."""
    text, _ = _decoded_head(head)
    return _DOC_START.search(text) is not None


@dataclass(frozen=True, slots=True)
class ParserOptions:
    """How :func:`open_parser` sets the parsers up.

    Args:
        host: host label of the records.
        hist: hist-log options (interval, GROUP_NR, unit, time offset, line limit).
        json_group_nr: GROUP_NR of json+ bins (None: fio 3's 29).
        skip_jobs: json+ job positions not to read.
        max_document_bytes: largest json+ document accepted.
        client_logs: undo the cumulative counts of ``fio --client`` hist logs (named
            by :func:`fiomon.fio.clientlog.client_log_host`).
        latency: the latency read: json+ ``clat_ns``, ``lat_ns`` or ``slat_ns`` bins;
            hist logs hold ``clat`` only and are refused for another kind.
    """

    host: str = ""
    hist: HistLogOptions = field(default_factory=HistLogOptions)
    json_group_nr: int | None = None
    skip_jobs: frozenset[int] = frozenset()
    max_document_bytes: int = MAX_DOCUMENT_BYTES
    client_logs: bool = True
    latency: LatencyKind = "clat"


def open_parser(
    head: bytes, source: str, problems: ProblemLog, options: ParserOptions | None = None
) -> RecordParser:
    """The parser for the file ``source`` whose first bytes are ``head`` (not blank).

    The parser takes the file's bytes as they are (compressed, UTF-16, ...) from its
    first byte on. Problems (bad lines, documents, a refusal) go to ``problems``.
    """
    opts = options or ParserOptions()
    if fio_log_store(head):
        return RefusedParser(source, problems, FIO_STORE_REFUSAL)

    def make(text: bytes) -> RecordParser:
        if _classify(text) == "json":
            parser = JsonStatusParser(
                source,
                host=opts.host,
                problems=problems,
                layout=BinLayout(opts.json_group_nr) if opts.json_group_nr else None,
                skip_jobs=opts.skip_jobs,
                latency=opts.latency,
            )
            parser.splitter.max_document_bytes = opts.max_document_bytes
            return parser
        if opts.latency != "clat" and not PER_IO_LOG_NAME.search(Path(source).name):
            return RefusedParser(source, problems, hist_log_kind_refusal(opts.latency))
        hist = HistLogParser(source, host=opts.host, options=opts.hist, problems=problems)
        if opts.client_logs and client_log_host(Path(source)) is not None:
            return ClientHistLogParser(hist, ClientLogUndo(source, problems))
        return hist

    text, decoder = _decoded_head(head)
    if decoder is None:
        return make(text)
    return DecodedParser(make, decoder, source, problems, text)


# fio's per-I/O latency, bw and iops logs: their own parsers say what they are.
PER_IO_LOG_NAME = re.compile(r"_(?:lat|clat|slat|bw|iops)(?:\.\d+)?\.log\b")


def hist_log_kind_refusal(latency: LatencyKind) -> str:
    """Why a hist log cannot be read for ``latency`` (not ``clat``), and what can."""
    option = "lat_percentiles=1" if latency == "lat" else "slat_percentiles=1"
    return (
        f"a hist log holds completion latency (clat) only, not {latency}: --latency "
        f"{latency} cannot read it; give the json+ status stream of fio run with "
        f"{option}, or the {latency} per-I/O logs (write_lat_log=NAME with "
        f"log_avg_msec=0: NAME_{latency}.N.log), or use --latency clat"
    )


FIO_STORE_REFUSAL = (
    "fio's zlib-compressed log store (log_compression with log_store_compressed=1), "
    "not a readable log; a lat/bw/iops log inflates with `fio --inflate-log=FILE`, but a "
    "hist log does not (fio 3.33 prints a memory address where its bins were): re-run fio "
    "with log_store_compressed=0 (log_compression alone still bounds fio's memory and "
    "writes a readable log)"
)


class RefusedParser:
    """A file that is known not to be readable: one ``refused`` problem, no records.

    Args:
        source: the file, for the message.
        problems: where the refusal is reported (once, on the first bytes).
        reason: what the file is and how to get a readable one.
    """

    kind: Kind = "hist"
    layout: BinLayout | None = None
    time_kind: TimeKind | None = None
    slack_ms = 0

    def __init__(self, source: str, problems: ProblemLog, reason: str) -> None:
        self.source = source
        self.problems = problems
        self.refusal: str | None = reason
        self._told = False

    def feed(self, data: bytes) -> RecordBatch | None:
        """No records; the refusal is reported on the first call."""
        if not self._told and self.refusal is not None:
            self._told = True
            self.problems.report(self.source, 0, "refused", self.refusal)
        return None

    def finish(self) -> RecordBatch | None:
        """No records."""
        return self.feed(b"")


class DecodedParser:
    """A parser fed through an :class:`~fiomon.fio.decode.InputDecoder` (compressed, UTF-16, BOM).

    The parser is built from the first decoded bytes that say what the file is: a
    compressed file's head may decode to nothing yet (bzip2 emits nothing before a whole
    block of up to 900 kB is in).

    Args:
        make: builds the parser for the decoded bytes from their first bytes.
        decoder: undoes the file's compression and text encoding.
        source: the file, for messages.
        problems: where corrupt compressed data is reported.
        head: the decoded head (blank if it said nothing yet).
    """

    def __init__(
        self,
        make: Callable[[bytes], RecordParser],
        decoder: InputDecoder,
        source: str,
        problems: ProblemLog,
        head: bytes = b"",
    ) -> None:
        self._make = make
        self.parser: RecordParser | None = make(head) if _classify(head) else None
        self.decoder = decoder
        self.source = source
        self.problems = problems
        self._held: list[bytes] = []  # decoded bytes before the parser is known (blanks)
        self._told = False

    @property
    def kind(self) -> Kind:
        """The decoded file's kind (``hist`` until known)."""
        return "hist" if self.parser is None else self.parser.kind

    @property
    def layout(self) -> BinLayout | None:
        """The decoded file's layout, once known."""
        return None if self.parser is None else self.parser.layout

    @property
    def time_kind(self) -> TimeKind | None:
        """The decoded file's time kind, once known."""
        return None if self.parser is None else self.parser.time_kind

    @property
    def slack_ms(self) -> int:
        """As the decoded file's."""
        return 0 if self.parser is None else self.parser.slack_ms

    @property
    def refusal(self) -> str | None:
        """The decoded file's refusal, if any."""
        return None if self.parser is None else self.parser.refusal

    def feed(self, data: bytes) -> RecordBatch | None:
        """Decode ``data`` and parse what it completes."""
        return self._parse(list(self.decoder.feed(data)), final=False)

    def finish(self) -> RecordBatch | None:
        """Decode the rest and finish the parser."""
        return self._parse(list(self.decoder.finish()), final=True)

    def _known(self, pieces: list[bytes]) -> list[bytes]:
        """``pieces`` for the parser, once one is built (held back until then)."""
        if self.parser is not None:
            return pieces
        self._held.extend(pieces)
        head = b"".join(self._held)[:_SNIFF_TEXT_BYTES]
        if _classify(head) is None:
            if len(head) >= _SNIFF_TEXT_BYTES:
                self._held = []  # that many blanks: nothing to keep
            return []
        self.parser = self._make(head)
        pieces, self._held = self._held, []
        return pieces

    def _parse(self, pieces: list[bytes], *, final: bool) -> RecordBatch | None:
        pieces = self._known(pieces)
        parser = self.parser
        if parser is None:
            if final:
                self.problems.warn(self.source, 0, "empty", "empty once decompressed")
            return None
        batches = [b for b in map(parser.feed, pieces) if b is not None and len(b)]
        if self.decoder.error is not None and not self._told:
            self._told = True
            what = self.decoder.description
            self.problems.report(
                self.source, 0, "corrupt", f"{what}: {self.decoder.error}; read up to there"
            )
        if final:
            last = parser.finish()
            if last is not None and len(last):
                batches.append(last)
        if not batches:
            return None
        return batches[0] if len(batches) == 1 else RecordBatch.concat(batches)


class ClientHistLogParser:
    """A ``fio --client`` hist log: a hist-log parser whose counts are made per interval."""

    kind: Kind = "hist"

    def __init__(self, parser: HistLogParser, undo: ClientLogUndo) -> None:
        self.parser = parser
        self.undo = undo

    @property
    def layout(self) -> BinLayout | None:
        """The hist log's layout, once known."""
        return self.parser.layout

    @property
    def time_kind(self) -> TimeKind | None:
        """The hist log's time kind, once known."""
        return self.parser.time_kind

    @property
    def slack_ms(self) -> int:
        """As the hist log's."""
        return self.parser.slack_ms

    def feed(self, data: bytes) -> RecordBatch | None:
        """Parse, then undo the cumulative counts."""
        return self.undo.feed(self.parser.feed(data))

    def finish(self) -> RecordBatch | None:
        """Finish, then undo the cumulative counts."""
        return self.undo.feed(self.parser.finish(), final=True)

    @property
    def refusal(self) -> str | None:
        """The hist log's refusal, if any."""
        return self.parser.refusal
