"""The one rule for recognising fio's outputs by content, and the parser interface.

fio writes three kinds of histogram output that fiomon reads: the json+ status stream
(``--output-format=json+`` with ``--status-interval``), hist logs (``log_hist_msec``), and
the hist logs a ``fio --client`` run writes (the server's address appended to the name,
every record counted as often as jobs have run before it: :mod:`fiomon.clientlog`).
A file's first bytes tell json+ from a hist log (:func:`sniff`); :func:`open_parser`
builds the matching :class:`RecordParser`, which the agent's follower and the offline
sources feed alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from fiomon.bins import BinLayout
from fiomon.clientlog import ClientLogUndo, client_log_host
from fiomon.fiojson import MAX_DOCUMENT_BYTES, JsonStatusParser, looks_like_json
from fiomon.fiolog import HistLogOptions, HistLogParser, TimeKind
from fiomon.model import RecordBatch
from fiomon.problems import ProblemLog

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


SNIFF_BYTES = 4096  # how much of a file's head every reader hands to sniff (agent, offline)


def sniff(head: bytes) -> Kind | None:
    """``json`` or ``hist`` from a file's first bytes (None while it holds only blanks)."""
    if not head.strip():
        return None
    return "json" if looks_like_json(head) else "hist"


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
            by :func:`fiomon.clientlog.client_log_host`).
    """

    host: str = ""
    hist: HistLogOptions = field(default_factory=HistLogOptions)
    json_group_nr: int | None = None
    skip_jobs: frozenset[int] = frozenset()
    max_document_bytes: int = MAX_DOCUMENT_BYTES
    client_logs: bool = True


def open_parser(
    head: bytes, source: str, problems: ProblemLog, options: ParserOptions | None = None
) -> RecordParser:
    """The parser for the file ``source`` whose first bytes are ``head`` (not blank).

    Problems (bad lines, documents) go to ``problems``.
    """
    opts = options or ParserOptions()
    if sniff(head) == "json":
        parser = JsonStatusParser(
            source,
            host=opts.host,
            problems=problems,
            layout=BinLayout(opts.json_group_nr) if opts.json_group_nr else None,
            skip_jobs=opts.skip_jobs,
        )
        parser.splitter.max_document_bytes = opts.max_document_bytes
        return parser
    hist = HistLogParser(source, host=opts.host, options=opts.hist, problems=problems)
    if opts.client_logs and client_log_host(Path(source)) is not None:
        return ClientHistLogParser(hist, ClientLogUndo(source, problems))
    return hist


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
