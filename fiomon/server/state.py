"""A service's state on disk: the locked state directory, its journal, the quanta writer.

One object per service (aggregator or root), so both lock, journal, write, release and
close the same way:

* ``state_dir`` set: the directory is locked (a second service on it gets
  :class:`~fiomon.errors.StateLockedError`, naming the holder's pid) and every received
  message is journaled (:class:`~fiomon.server.journal.Journal`) before the broker is
  acknowledged; a journal segment goes once what it holds is confirmed published.
* ``quanta_file`` set: closed quanta are written on a thread of their own
  (:class:`~fiomon.server.quantafile.QuantaWriter`), followed by the grid state when the
  merger keeps one (``state.json``).

Problems (a full disk, a garbled file) are logged and counted in
``fiomon_state_errors_total``; they come from the writer thread too, hence the lock.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from fiomon.config import AggregatorConfig
from fiomon.errors import StateLockedError
from fiomon.server.journal import Journal, StateLock
from fiomon.server.metrics import Counts
from fiomon.server.quantafile import QuantaFile, QuantaWriter

GRID_STATE_FILE = "state.json"  # the grid and how far the quanta file is confirmed
# The journal kept for the revision horizon at most, bytes (its oldest segments go first).
JOURNAL_KEEP_BYTES = 4 << 30
_FAR = 2**62


class StateDir:
    """Lock, journal and quanta writer of one service, as its configuration asks.

    Nothing is opened before :meth:`open` (a merger may be built and fed without disk).

    Args:
        cfg: the configuration (``state_dir``, ``quanta_file`` and its rotation).
        service: ``aggregator`` or ``root`` (the lock's refusal names it).
        counts: where problems are counted (``state_errors``).
        log: where problems are logged.
        grid_state: the writer saves a grid state after each write (the aggregator).
    """

    def __init__(
        self,
        cfg: AggregatorConfig,
        *,
        service: str,
        counts: Counts,
        log: logging.Logger,
        grid_state: bool,
    ) -> None:
        self.cfg = cfg
        self.service = service
        self.counts = counts
        self.log = log
        self._problem_lock = threading.Lock()  # problems also come from the writer thread
        self.lock: StateLock | None = None
        self.journal: Journal | None = None
        self.state_path: Path | None = None
        if grid_state and cfg.state_dir is not None:
            self.state_path = cfg.state_dir / GRID_STATE_FILE
        self.quanta: QuantaFile | None = None
        self.writer: QuantaWriter | None = None
        # The latest record end in journal segments deleted for their size (a restart
        # revises only quanta starting after it).
        self.journal_cut_ms = -_FAR

    def open(self) -> None:
        """Lock the state directory, open the journal, the quanta file and its writer.

        Raises:
            StateLockedError: another process holds the state directory.
            OSError: the state directory cannot be created.
        """
        cfg = self.cfg
        if cfg.state_dir is not None:
            try:
                self.lock = StateLock(cfg.state_dir, self.service)
            except StateLockedError:
                self.counts.state_errors["lock"] += 1
                raise
            self.journal = Journal(cfg.state_dir / "journal", problems=self.problem)
        if cfg.quanta_file is not None:
            self.quanta = QuantaFile(
                cfg.quanta_file, cfg.quanta_file_max_bytes, cfg.quanta_file_keep, self.problem
            )
        if self.quanta is not None or self.state_path is not None:
            self.writer = QuantaWriter(self.quanta, self.state_path, self.problem)

    def problem(self, kind: str, text: str) -> None:
        """A problem with the state directory or the quanta file: logged and counted."""
        with self._problem_lock:
            self.counts.state_errors[kind] += 1
        self.log.error("%s: %s", kind, text)

    def release(self, published_ms: int | None, keep_ms: int = 0) -> None:
        """Let the journal drop what is done with.

        Done: what the writer confirmed on disk; without a writer, ``published_ms``
        (every quantum ending by then is published, epoch ms; None: nothing yet). Records
        of quanta within ``keep_ms`` before that stay (the revision horizon: a restart
        re-forms those quanta from them, so it can still revise them).
        """
        if self.journal is None:
            return
        done = self.writer.confirmed_ms if self.writer is not None else published_ms
        if done is not None:
            self.journal.release(done - keep_ms)
            if keep_ms:
                cut = self.journal.trim(JOURNAL_KEEP_BYTES, done)
                if cut is not None and cut > self.journal_cut_ms:
                    if self.journal_cut_ms == -_FAR:
                        self.log.warning(
                            "the journal kept for revise_within passed %d MiB: its oldest "
                            "segments go, so a restart can revise only quanta after %d "
                            "(the running aggregator still revises the whole horizon)",
                            JOURNAL_KEEP_BYTES >> 20,
                            cut,
                        )
                    self.journal_cut_ms = cut

    def finish(self, timeout_s: float) -> None:
        """Wait for the writer to finish what it was handed (at most ``timeout_s``)."""
        if self.writer is not None and not self.writer.close(timeout_s):
            self.problem("quanta-file-write", f"the disk did not finish in {timeout_s:g} s")

    def close(self) -> None:
        """Close the journal and unlock (after :meth:`finish`).

        No journal release here: messages received since the last tick are journaled but
        not yet judged, so no segment is known to be done.
        """
        if self.journal is not None:
            self.journal.close()
        if self.lock is not None:
            self.lock.release()
