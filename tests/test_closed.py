"""The closed-quantum row: its JSON line is the JSON object, character for character."""

from __future__ import annotations

import numpy as np

from fiomon.closed import _LINE_ENCODER, ClosedQuantum
from fiomon.histogram import HistStats


def test_json_line_is_the_encoded_json_object_character_for_character() -> None:
    # to_json_line formats field by field (the aggregator writes thousands of rows a
    # second); it must stay exactly json of to_json, for every kind of value.
    nums = [0.0, 1.0, 2.5, -3.0, 1 / 3, 1e-7, 123456789.123456, 2.0**53, 2.0**60, 1e300]
    nums += [4708761.600000001, 1234567890123.4, float("nan"), float("inf"), -float("inf")]
    rng = np.random.default_rng(7)
    nums += (rng.lognormal(10, 5, 200) * rng.choice([-1, 1], 200)).tolist()
    rows = []
    for i, x in enumerate(nums):
        y = nums[(i * 7 + 3) % len(nums)]
        stats = HistStats(
            samples=x,
            min_ns=y,
            mean_ns=x * 1.1,
            max_ns=float(i),
            percentiles_ns={"50": x, "99.9": y},
            saturated=("99.9",) if i % 3 == 0 else (),
        )
        ci: dict[str, tuple[float | None, float | None]] | None = (
            None if i % 4 == 0 else {"50": (int(i), None), "99.9": (y, float(i) + 0.5)}
        )
        rows.append(
            ClosedQuantum(
                start_ms=1_700_000_000_000 + i,
                end_ms=1_700_000_001_000 + i,
                scope="host" if i % 2 else "cluster",
                host=['h\u00e9"x\\y\n', "h1", None][i % 3],
                direction="read",
                stats=stats,
                iops=None if i % 5 == 0 else y,
                bytes_per_second=None if i % 6 == 0 else x * 4096,
                streams=i,
                late_records=i % 3,
                ci_ns=ci,
                target_met=[None, True, False][i % 3],
            )
        )
    for r in rows:
        assert r.to_json_line() == _LINE_ENCODER.encode(r.to_json()) + "\n"
