"""The README's picture of ``fiomon compare``'s page: ``docs/img/compare.png``.

Two simulated runs (:func:`fiomon.tools.simulate.write_cluster`: 4 hosts, 400 IOPS each,
90 s, fio's hist-log format), the candidate's client-01 3x slower from 30 to 60 s, compared
per host through :func:`fiomon.offline.compare.run.run_compare`, drawn as the HTML page
and photographed whole in headless Chromium (:mod:`tests.browser`), then reduced to 256
colours so the picture stays small (it must stay under 300 KB)::

    scripts/compare-screenshot            # or: python benchmarks/compare_screenshot.py OUT
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for tests

from PIL import Image

from fiomon.offline.compare.model import CompareOptions
from fiomon.offline.compare.page import write_figure
from fiomon.offline.compare.run import RunInput, run_compare, run_files
from fiomon.offline.quanta import QuantaOptions
from fiomon.offline.sources import SourceOptions
from fiomon.tools.simulate import write_cluster
from tests.browser import Browser

MAX_BYTES = 300_000
TITLE = "simulated: client-01 3x slower from 30 to 60 s"


def main(argv: list[str] | None = None) -> int:
    """Write the picture; the exit status says whether it fits the size limit."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", type=Path, default=Path("docs/img/compare.png"))
    p.add_argument("--width", type=int, default=1200, help="page width, px")
    args = p.parse_args(argv)
    out: Path = args.out.resolve()
    with tempfile.TemporaryDirectory(prefix="fiomon-compare-shot-") as tmp:
        os.chdir(tmp)  # the page names the runs as given: "runs/baseline", not /tmp/...
        for name, seed, slow in (("baseline", 1, 0), ("candidate", 2, 1)):
            write_cluster(
                Path("runs") / name, hosts=4, jobs_per_host=1, seconds=90, iops=400,
                slow_hosts=slow, slow_window_s=(30, 60), slow_factor=3.0, seed=seed,
            )  # fmt: skip
        runs = [
            RunInput(name, f"runs/{name}", tuple(run_files(f"runs/{name}")), SourceOptions())
            for name in ("baseline", "candidate")
        ]
        opts = CompareOptions(quanta=QuantaOptions(per_host=True))
        result = run_compare(runs[0], runs[1], opts, io.StringIO())
        page = Path(tmp) / "compare.html"
        write_figure(result, page, "html", TITLE)
        shot = Path(tmp) / "shot.png"
        with Browser(args.width, 1000) as b:
            b.goto(page.as_uri())
            b.state()
            b.screenshot(shot)
            errors = list(b.errors)
        if errors:
            print(f"the page reported errors: {errors}", file=sys.stderr)
            return 1
        with Image.open(shot) as im:
            small = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
            small.save(out, optimize=True)
    size = out.stat().st_size
    print(f"{out}: {size:,} bytes")
    if size > MAX_BYTES:
        print(f"larger than {MAX_BYTES:,} bytes: make the page narrower (--width)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
