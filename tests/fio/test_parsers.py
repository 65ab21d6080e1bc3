"""The one content sniffer and the parsers it opens (json+, hist log, fio --client hist log)."""

from __future__ import annotations

from pathlib import Path

from fiomon.fio.fiojson import JsonStatusParser
from fiomon.fio.fiolog import HistLogParser
from fiomon.fio.parsers import ClientHistLogParser, ParserOptions, RecordParser, open_parser, sniff
from fiomon.fio.problems import ProblemLog
from fiomon.model import RecordBatch

FIXTURES = Path(__file__).parent.parent / "fixtures"


def _read(parser: RecordParser, data: bytes, chunk: int = 4096) -> RecordBatch:
    batches = [parser.feed(data[i : i + chunk]) for i in range(0, len(data), chunk)]
    batches.append(parser.finish())
    return RecordBatch.concat([b for b in batches if b is not None and len(b)])


def test_sniff_tells_json_from_hist_logs_by_content() -> None:
    assert sniff(b'  \n{\n  "fio version"') == "json"
    assert sniff(b"1000, 0, 4096, 0, 0, 1") == "hist"
    assert sniff(b"") is None
    assert sniff(b" \n\t") is None  # fio has created the file but written nothing yet


def test_open_parser_reads_each_kind_as_its_own_parser_does() -> None:
    for name, cls in (
        ("fio333_randrw_status.json", JsonStatusParser),
        ("fio333_randrw_clat_hist.1.log", HistLogParser),
    ):
        data = (FIXTURES / name).read_bytes()
        parser = open_parser(data[:64], name, ProblemLog())
        assert isinstance(parser, cls)
        assert parser.kind == ("json" if cls is JsonStatusParser else "hist")
        got = _read(parser, data)
        want = _read(cls(name), data)
        assert len(got) > 0
        assert got.counts.tolist() == want.counts.tolist()
        assert got.end_ms.tolist() == want.end_ms.tolist()
        assert parser.time_kind == "epoch"
        assert parser.layout == want.layout


def test_a_fio_client_hist_log_gets_the_client_parser_unless_asked_not_to(
    tmp_path: Path,
) -> None:
    data = (FIXTURES / "fio333_randrw_clat_hist.1.log").read_bytes()
    client = tmp_path / "job_clat_hist.1.log.10.0.0.7"  # fio --client appends the server
    client.write_bytes(data)
    parser = open_parser(data[:64], str(client), ProblemLog())
    assert isinstance(parser, ClientHistLogParser)
    assert parser.kind == "hist"
    assert parser.slack_ms == 2 * 1000  # as the hist log's (interval not known yet)
    # The agent refuses these by name before opening them: no undo layer there.
    plain = open_parser(data[:64], str(client), ProblemLog(), ParserOptions(client_logs=False))
    assert isinstance(plain, HistLogParser)
