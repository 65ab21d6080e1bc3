"""Offline host names (``--host-from``) with the documented layouts.

``fiomon fio --output-dir /var/lib/fio/results`` names a host's files ``<host>.json`` and
``<host>_clat_hist.N.log``; collected centrally they typically end up as
``<host>/results/...`` (``scp -r``), ``<host>/...`` (``rsync``) or all in one folder. The
folder's own name ("results" for every host) is what ``--per-host`` used to label them with.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from fiomon.cli import main
from fiomon.errors import ConfigError
from fiomon.offline.sources import host_labels
from fiomon.tools.simulate import write_cluster

HOSTS = ["client-01", "client-02", "client-03"]


def _paths(*names: str) -> list[Path]:
    return [Path("/collected") / n for n in names]


SCP = _paths(
    "client-01/results/client-01.json",
    "client-01/results/client-01_clat_hist.1.log",
    "client-02/results/client-02_clat_hist.1.log",
)


@pytest.mark.parametrize(
    ("paths", "how", "labels"),
    [
        (SCP, "auto", ["client-01", "client-01", "client-02"]),
        (SCP, "dir", ["results", "results", "results"]),  # what --per-host used to say
        (SCP, "dir:2", ["client-01", "client-01", "client-02"]),
        (SCP, "file", ["client-01", "client-01", "client-02"]),
        (SCP, r"regex:/(client-\d+)/", ["client-01", "client-01", "client-02"]),
        (
            _paths("client-01.json", "client-01_clat_hist.2.log", "client-02_clat_hist.log.fz"),
            "auto",  # all in one folder: the file names tell the hosts
            ["client-01", "client-01", "client-02"],
        ),
        (_paths("a/run_clat_hist.1.log", "b/run_clat_hist.1.log"), "auto", ["a", "b"]),
        (  # each host's results split into the same sub-folders: the hosts are above them
            _paths(
                "client-01/json/out.json",
                "client-01/hist/run_clat_hist.1.log",
                "client-02/json/out.json",
                "client-02/hist/run_clat_hist.1.log",
            ),
            "auto",
            ["client-01", "client-01", "client-02", "client-02"],
        ),
        (  # not the same sub-folders on every host: their paths tell them apart
            _paths("c1/x/r.log", "c2/x/r.log", "c1/y/r.log"),
            "auto",
            ["c1/x", "c2/x", "c1/y"],
        ),
        (_paths("a/run_clat_hist.1.log", "a/notes.txt"), "file", ["run", "notes"]),
        (  # fio --client: every server's logs on the controller, named after the server
            _paths("run1/h_clat_hist.1.log.127.0.0.2", "run2/h_clat_hist.2.log.srv-b"),
            "auto",  # the suffix wins over folders that tell runs, not hosts, apart
            ["127.0.0.2", "srv-b"],
        ),
        (_paths("h_clat_hist.1.log.fz.srv-a", "h_clat_hist.1.log.fz"), "file", ["srv-a", "h"]),
    ],
)
def test_host_labels(paths: list[Path], how: str, labels: list[str]) -> None:
    assert host_labels(paths, how) == labels


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("folder", "expected auto, dir, dir:N, file or regex:PATTERN"),
        ("dir:0", "dir:N is a whole number >= 1"),
        ("regex:(", "not a regular expression"),
        ("regex:node-\\d+", "no host in /collected/client-01/results/client-01.json"),
        ("dir:9", "has no folder 9 level(s) up"),
        (r"regex:(?P<host>\d*)client", "an empty host in /collected/client-01"),
    ],
)
def test_bad_modes_say_what_is_wrong(how: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        host_labels(SCP, how)


def _run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three hosts' hist logs as ``<host>/results/<host>_clat_hist.N.log``."""
    root = tmp_path_factory.mktemp("collected")
    staged = write_cluster(root / "staged", hosts=3, jobs_per_host=2, seconds=8, seed=3)
    paths = []
    for p in staged:
        host = p.parent.name
        dest = root / host / "results" / p.name.replace("job", host)
        dest.parent.mkdir(parents=True, exist_ok=True)
        p.rename(dest)
        paths.append(dest)
    return paths


def _samples(paths: list[Path]) -> int:
    return sum(
        sum(int(x) for x in line.split(",")[3:])
        for p in paths
        for line in p.read_text().splitlines()
    )


def test_per_host_report_names_the_hosts_of_the_documented_layout(collected: list[Path]) -> None:
    code, out, err = _run("report", "--per-host", "--format", "jsonl", *map(str, collected))
    assert code == 0, err
    rows = [json.loads(x) for x in out.splitlines()]
    host_rows = [r for r in rows if r["scope"] == "host" and r["direction"] == "all"]
    assert {r["host"] for r in host_rows} == set(HOSTS)
    for host in HOSTS:
        mine = [p for p in collected if p.parent.parent.name == host]
        got = sum(r["samples"] for r in host_rows if r["host"] == host)
        assert got == pytest.approx(_samples(mine), rel=1e-12)
    code, out, _ = _run(
        "report", "--per-host", "--host-from", "dir", "--format", "jsonl", *map(str, collected)
    )
    assert {json.loads(x)["host"] for x in out.splitlines()} == {None, "results"}


def test_summary_and_fit_pick_one_host(collected: list[Path]) -> None:
    code, out, err = _run(
        "summary", "--host", "client-02", "--format", "json", *map(str, collected)
    )
    assert code == 0, err
    mine = [p for p in collected if p.parent.parent.name == "client-02"]
    total = next(op for op in json.loads(out) if op["operation"] == "all")
    assert total["ios"] == _samples(mine)
    code, out, err = _run(
        "fit", "--host", "client-02", "--direction", "read", "--format", "json",
        *map(str, collected),
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["direction"] == "read"
    code, _, err = _run("fit", "--host", "results", *map(str, collected))
    assert code == 1
    assert "no file of host results (hosts here: client-01, client-02, client-03)" in err
