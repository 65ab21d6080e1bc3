"""A cell cut off from the root past its lateness is revised in (issue 25), on real parts.

``tests/root/test_root_faults.py``'s cluster (two Mosquittos, cells ``c1`` and ``c2`` of
three agents each, a ``fiomon root`` process with lateness 10 s and the default
``revise_within`` of 10 minutes, simulated fio logs written in real time), with ``c2``'s
partials going to the root's broker through a TCP relay (:mod:`tests.tcprelay`). The
relay is cut for about 30 s while ``c2``'s hosts keep sending records to it: the cell
closes its quanta on time and keeps their partials in its outbox; the root closes those
quanta on its lateness without ``c2`` (``cells_missing: ["c2"]``). Once the link is back
the cell's partials come, all of them after their quanta closed at the root, and the
root revises: the latest revision of every root row must equal ``fiomon report
--per-host`` over every host's logs (to 1e-9 relative, the merge's float sums; bookkeeping
fields aside) and say ``complete``, with no row left out as late.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tests.aggregator.test_aggregator_live import offline_report, replay_logs
from tests.conftest import DEADLINE_S, until
from tests.root.test_root_faults import (
    HOST_CELL,
    ROOT_LATENESS_S,
    FaultCluster,
    Row,
    _brokers,
    _differs,
    _ends,
    _key,
    _now_s,
    _sample,
    _settle,
    _stage,
)
from tests.root.test_root_live import CELLS, _stop
from tests.tcprelay import Relay

CUT_S = 30


def latest(rows: list[Row]) -> dict[tuple[int, str, str, str], Row]:
    """The highest revision of each key; on equal revision the later line (readers' rule)."""
    out: dict[tuple[int, str, str, str], Row] = {}
    for r in rows:
        k = _key(r)
        have = out.get(k)
        if have is None or int(str(r.get("revision", 0))) >= int(str(have.get("revision", 0))):
            out[k] = r
    return out


def _settled(c: FaultCluster, last_end: int) -> bool:
    """The last quantum is in and every key's latest revision says complete."""
    rows = latest(c.root_rows())
    return any(k[0] == last_end for k in rows) and all(r["complete"] for r in rows.values())


async def test_a_cell_cut_from_the_root_for_30_s_is_revised_in_exactly(
    mosquitto_bin: str, tmp_path: Path
) -> None:
    a, b = await _brokers(mosquitto_bin, tmp_path)
    relay = Relay(a.port)
    await relay.start()
    c = FaultCluster(tmp_path, a, b)
    # c2's partials (not its records) go through the relay to the root's broker.
    cfg = tmp_path / "c2.yaml"
    direct = f"partials: {{cell: c2, broker: {{port: {a.port}}}"
    assert direct in cfg.read_text()
    cfg.write_text(
        cfg.read_text().replace(direct, f"partials: {{cell: c2, broker: {{port: {relay.port}}}")
    )
    procs: list[asyncio.subprocess.Process] = []
    writer: asyncio.Task[None] | None = None
    late_rows = -1.0
    cut_for_s = 0.0
    try:
        procs.append(await c.root())
        procs += [await c.cell(name) for name in CELLS]
        procs += await c.agents()
        start = _now_s()
        staged = _stage(tmp_path / "staged", names=sorted(HOST_CELL), start_ms=start,
                        seconds=CUT_S + 25, seed=17)  # fmt: skip
        last_end = max(_ends(offline_report(staged)[0]))
        writer = asyncio.create_task(replay_logs(staged, tmp_path / "data", start_ms=start,
                                                 speedup=1.0))  # fmt: skip
        await until(lambda: len(c.closed_ends()) >= 2, what="the root closed two quanta")
        await relay.cut()
        cut_ms = time.time_ns() // 1_000_000
        # Cut until the root closed, without c2, quanta ending CUT_S - 2 s after the cut:
        # once c2 is gone (cell_timeout, 10 s) the root closes on c1's marks, a second or
        # two after each quantum's end, so that is about CUT_S of cut (printed).
        await until(
            lambda: max(c.closed_ends()) >= cut_ms + (CUT_S - 2) * 1000,
            what=f"the root closed quanta ending {CUT_S - 2} s after the cut",
            within=DEADLINE_S,
        )
        cut_for_s = (time.time_ns() // 1_000_000 - cut_ms) / 1000
        await relay.start()
        await writer
        await _settle(lambda: _settled(c, last_end), ROOT_LATENESS_S + 30)
        late_rows = await asyncio.to_thread(
            _sample, c.root_port, "fiomon_root_partial_rows_total", outcome="late"
        )
    finally:
        if writer is not None:
            writer.cancel()
        await _stop(procs)
        await relay.close()
        a.stop()
        b.stop()
    rows = c.root_rows()
    files = sorted(p.resolve() for p in (tmp_path / "data").glob("*/*.log"))
    offline = {_key(r): r for r in offline_report(files)[0]}
    final = latest(rows)
    said = f"cut for {cut_for_s:.1f} s\nthe processes said:\n{c.said()}"
    # The fault bit: quanta first published without c2, then revised.
    without = {
        _key(r)[0] for r in rows if r.get("cells_missing") == ["c2"] and "revised_at" not in r
    }
    revised = [r for r in rows if "revised_at" in r]
    assert len(without) >= CUT_S - ROOT_LATENESS_S, said
    assert revised and {_key(r)[0] for r in revised} >= without, said
    assert late_rows == 0, f"{late_rows} partial rows late at the root; {said}"
    # Every key's latest revision is the offline row, complete; none missing or extra.
    assert final.keys() == offline.keys(), (
        f"only at the root: {sorted(final.keys() - offline.keys())[:5]}, "
        f"only offline: {sorted(offline.keys() - final.keys())[:5]}; {said}"
    )
    wrong = []
    for k, r in final.items():
        measured = {f: v for f, v in r.items() if f != "revised_at"}
        diff = _differs(measured, offline[k])
        if diff is not None or r["complete"] is not True or r["cells_missing"] != []:
            wrong.append(f"{k} rev {r['revision']} complete={r['complete']}: {diff}")
    assert not wrong, f"{len(wrong)} of {len(final)} rows: {wrong[:10]}; {said}"
    print(
        f"{len(final)} rows equal to offline, {len(without)} quanta first published without "
        f"c2, {len(revised)} revision rows; {said[:22]}"
    )
