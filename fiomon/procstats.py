"""``process_*`` metrics of a service, also under systemd's ``ProcSubset=pid``.

``prometheus_client``'s :class:`~prometheus_client.ProcessCollector` reads the process's
``/proc/<pid>/stat``, ``limits`` and ``fd``, and the boot time from ``/proc/stat`` to turn
the start time (clock ticks since boot) into Unix time. The shipped units set
``ProcSubset=pid``, which hides ``/proc/stat``: the collector then exports nothing at all.
:class:`ServiceProcessCollector` takes the boot time from ``CLOCK_BOOTTIME`` there (the
same instant, to the second: both count suspend), and is otherwise that collector.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, ProcessCollector


class ServiceProcessCollector(ProcessCollector):
    """``ProcessCollector`` with a boot time that needs no ``/proc/stat``.

    Args:
        pid: the process to describe (default: this one).
        proc: the proc file system's mount point (tests point it elsewhere).
        registry: where to register (None: nowhere).
    """

    def __init__(
        self,
        pid: Callable[[], int | str] = lambda: "self",
        proc: str = "/proc",
        registry: CollectorRegistry | None = None,
    ) -> None:
        super().__init__(pid=pid, proc=proc, registry=registry)

    def _boot_time(self) -> float:
        try:
            boot: float = super()._boot_time()  # type: ignore[no-untyped-call]
        except OSError:  # ProcSubset=pid: /proc/stat is hidden
            return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        return boot
