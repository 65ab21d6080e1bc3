"""Time in tests: the epoch every test's data starts at, and a clock moved by hand."""

from __future__ import annotations

from typing import Generic, TypeVar

# 2026-11-18 11:06:40 UTC in epoch ms: a fixed start, so expected values can be written out.
T0 = 1_795_000_000_000

N = TypeVar("N", int, float)


class FakeClock(Generic[N]):
    """A clock that stands still until the test moves it.

    Call it for the time; set :attr:`t` or :meth:`advance` it. The unit is the one of
    the clock it stands in for: ``FakeClock(T0)`` for a wall clock in ms,
    ``FakeClock(1000.0)`` for a monotonic clock in s.
    """

    def __init__(self, t: N) -> None:
        self.t: N = t

    def __call__(self) -> N:
        return self.t

    def advance(self, dt: N) -> None:
        """Move the clock on by ``dt``."""
        self.t += dt
