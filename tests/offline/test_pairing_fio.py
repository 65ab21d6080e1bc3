"""One truth per I/O by identity, offline, against real fio's own total_ios.

Each case runs real fio (short rate-limited jobs) and checks ``fiomon report`` against
fio's final ``total_ios``: exact from json+ streams, and from hist logs within the last
partial interval fio never writes to them (log_hist_msec=250 at 100 IOPS: 25 I/Os, plus
jitter).
"""

from __future__ import annotations

import gzip
import subprocess
from pathlib import Path

import pytest

from tests.conftest import DEADLINE_S
from tests.fiorun import fiomon, job_file, report_counts, start_fio, total_ios, wait_fio
from tests.offline.test_fio_client import final_ios, fio_servers, load

pytestmark = pytest.mark.fio

LAST_INTERVAL = 60  # I/Os a hist log may lack: fio's unwritten last partial interval


def _hist_ok(counted: float, truth: int) -> bool:
    return truth - LAST_INTERVAL <= counted <= truth


def test_three_hosts_sharing_a_prefix_pair_only_within_their_folder(
    tmp_path: Path, fio_bin: str
) -> None:
    """client-01/, client-02/, client-03/: one job file (write_hist_log=run) on each host."""
    hosts = ["client-01", "client-02", "client-03"]
    procs = []
    for i, h in enumerate(hosts):
        job = job_file(tmp_path / h, iops=100 + 30 * i, runtime=2)
        procs.append(start_fio(fio_bin, job, tmp_path / h / "vm.json"))
    wait_fio(procs)
    truth = {h: total_ios(tmp_path / h / "vm.json") for h in hosts}
    files = [
        p for h in hosts for p in sorted((tmp_path / h).glob("*")) if p.suffix in (".json", ".log")
    ]
    assert len(files) == 6
    # --source json: every host exactly its stream's I/Os
    assert report_counts("--per-host", "--source", "json", *files) == {
        h: float(n) for h, n in truth.items()
    }
    # --source hist: every host its own logs (no stream of another host is read)
    hist = report_counts("--per-host", "--source", "hist", *files)
    print(f"three hosts, --source hist: {hist} against fio's {truth}")
    assert set(hist) == set(hosts)
    for h in hosts:
        assert _hist_ok(hist[h], truth[h]), (h, hist[h], truth[h])
    # no --source: asks, naming each host's stream with its own log
    r = fiomon("report", "--per-host", *files)
    assert r.returncode != 0
    for h in hosts:
        assert (
            f"{tmp_path / h / 'vm.json'} and 1 hist log(s): {tmp_path / h}/run_clat_hist.1.log"
            in r.stderr
        )


def test_two_concurrent_runs_sharing_a_prefix_in_one_folder(tmp_path: Path, fio_bin: str) -> None:
    """Run a (one job) and run b (two jobs, per_job_logs=0) write 'run' logs side by side.

    Both name their logs after the prefix 'run': only the content tells which stream holds
    which log.
    """
    a = job_file(tmp_path, iops=100, runtime=2, name="a.fio")
    b = job_file(tmp_path, iops=60, runtime=2, name="b.fio", extra="numjobs=2\nper_job_logs=0")
    wait_fio(
        [start_fio(fio_bin, a, tmp_path / "a.json"), start_fio(fio_bin, b, tmp_path / "b.json")]
    )
    logs = sorted(tmp_path.glob("run_clat_hist*.log"))
    assert [p.name for p in logs] == ["run_clat_hist.1.log", "run_clat_hist.log"]
    files = [tmp_path / "a.json", tmp_path / "b.json", *logs]
    truth = total_ios(tmp_path / "a.json") + total_ios(tmp_path / "b.json")
    assert report_counts("--source", "json", *files) == {"": float(truth)}
    counted = report_counts("--source", "hist", *files)[""]
    print(f"two concurrent runs, one folder, --source hist: {counted} against fio's {truth}")
    assert truth - 2 * LAST_INTERVAL <= counted <= truth, (counted, truth)  # two logs


def test_a_rerun_into_the_same_names_pairs_with_its_own_stream(
    tmp_path: Path, fio_bin: str
) -> None:
    """Two runs one after the other write the same hist log name; the second overwrites it.

    Seconds apart, time cannot tell the runs apart (a log may reach a status interval and
    more past its stream's last dump): the log's counts can.
    """
    first = job_file(tmp_path, iops=150, runtime=2, name="first.fio")
    wait_fio([start_fio(fio_bin, first, tmp_path / "first.json")])
    second = job_file(tmp_path, iops=80, runtime=2, name="second.fio")
    wait_fio([start_fio(fio_bin, second, tmp_path / "second.json")])
    log = tmp_path / "run_clat_hist.1.log"
    files = [tmp_path / "first.json", tmp_path / "second.json", log]
    t1, t2 = total_ios(tmp_path / "first.json"), total_ios(tmp_path / "second.json")
    # --source hist: the second run from its log, the first from its stream (no log left)
    counted = report_counts("--source", "hist", *files)[""]
    print(f"re-run, --source hist: {counted} against fio's {t1} + {t2}")
    assert _hist_ok(counted - t1, t2), (counted, t1, t2)
    assert report_counts("--source", "json", *files) == {"": float(t1 + t2)}


def test_a_plain_json_stream_covers_nothing(tmp_path: Path, fio_bin: str) -> None:
    """--output-format=json has no bins: its hist logs are the only histograms, read as is."""
    job = job_file(tmp_path, iops=100, runtime=2)
    wait_fio([start_fio(fio_bin, job, tmp_path / "plain.json", fmt="json")])
    log = tmp_path / "run_clat_hist.1.log"
    counted = report_counts(tmp_path / "plain.json", log)[""]
    assert _hist_ok(counted, total_ios(tmp_path / "plain.json"))


def test_fio_client_logs_filed_as_pbench_files_them(tmp_path: Path, fio_bin: str) -> None:
    """fio --client on two servers; the logs moved to clients/<server>/ without the suffix.

    Their running sums are recognised by content and undone: per server, fio's total_ios
    (less the last partial interval).
    """
    ips = ("127.0.0.2", "127.0.0.3")
    with fio_servers(fio_bin, ips) as port:
        job = job_file(tmp_path, prefix="h", rw="randrw", iops=100, runtime=3)
        cmd = [fio_bin]
        for ip in ips:
            cmd += [f"--client=ip:{ip},{port}", str(job)]
        out = tmp_path / "fio-result.json"
        cmd += ["--status-interval=1", "--output-format=json+", f"--output={out}"]
        r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, timeout=120, check=False)
        assert r.returncode == 0, r.stderr
    truth = final_ios(load(out))
    files = []
    for ip in ips:  # as pbench-fio files them: clients/<host>/, fio's suffix removed
        folder = tmp_path / "clients" / ip
        folder.mkdir(parents=True)
        (tmp_path / f"h_clat_hist.1.log.{ip}").rename(folder / "h_clat_hist.1.log")
        files.append(folder / "h_clat_hist.1.log")
    counted = report_counts("--per-host", *files)
    print(f"fio --client logs as pbench files them: {counted} against fio's {truth}")
    assert set(counted) == set(ips)
    for ip in ips:
        assert truth[ip] - 2 * LAST_INTERVAL <= counted[ip] <= truth[ip], (ip, counted, truth)
    done = fiomon("report", *files)
    assert "recognised by content" in done.stderr
    # With the controller's json+ beside them (pbench's fio-result): both views, paired by
    # server (fio's suffix, or the clients/<server>/ folder) and content.
    both = [out, *files]
    asked = fiomon("report", "--per-host", *both)
    assert asked.returncode != 0
    assert "and 2 hist log(s)" in asked.stderr
    assert report_counts("--per-host", "--source", "json", *both) == {
        ip: float(n) for ip, n in truth.items()
    }
    assert report_counts("--per-host", "--source", "hist", *both) == counted


@pytest.mark.parametrize(
    ("extra", "logs"),
    [
        ("numjobs=2\ngroup_reporting=1", 2),  # one json entry, a log per thread
        ("numjobs=2\nper_job_logs=0", 1),  # two json entries, one log for both
        ("numjobs=2", 2),  # log N is job N-1
        ("lat_percentiles=1", 1),  # json+ carries clat_ns and lat_ns bins
        ("log_hist_coarseness=4", 1),  # the log's bins are 16 of json+'s
    ],
)
def test_options_that_shape_logs_and_entries_pair_exactly(
    tmp_path: Path, fio_bin: str, extra: str, logs: int
) -> None:
    job = job_file(tmp_path, iops=100, runtime=2, extra=extra)
    wait_fio([start_fio(fio_bin, job, tmp_path / "vm.json")])
    hist = sorted(tmp_path.glob("run_clat_hist*.log"))
    assert len(hist) == logs
    files = [tmp_path / "vm.json", *hist]
    truth = total_ios(tmp_path / "vm.json")
    r = fiomon("report", *files)
    assert r.returncode != 0
    assert f"and {logs} hist log(s)" in r.stderr  # every log paired: asks
    assert report_counts("--source", "json", *files) == {"": float(truth)}
    counted = report_counts("--source", "hist", *files)[""]
    assert truth - logs * LAST_INTERVAL <= counted <= truth, (counted, truth)


def test_hist_logs_of_zeros_beside_lat_only_bins_pair_with_nothing(
    tmp_path: Path, fio_bin: str
) -> None:
    """clat_percentiles=0, lat_percentiles=1: fio 3.33's json+ has lat_ns bins only and its
    hist logs hold zeros. Its bins are total latency, never counted as clat: the default
    (clat) asks for --latency lat, which counts every I/O from the stream."""
    job = job_file(tmp_path, iops=100, runtime=2, extra="clat_percentiles=0\nlat_percentiles=1")
    wait_fio([start_fio(fio_bin, job, tmp_path / "vm.json")])
    files = [tmp_path / "vm.json", tmp_path / "run_clat_hist.1.log"]
    r = fiomon("report", *files)
    assert r.returncode != 0
    assert "its lat_ns bins are read with --latency lat" in r.stderr, r.stderr
    total = float(total_ios(tmp_path / "vm.json"))
    assert report_counts("--latency", "lat", *files) == {"": total}


def test_a_compressed_stream_pairs_with_its_hist_log(tmp_path: Path, fio_bin: str) -> None:
    """A json+ stream gzipped after the run still declares its jobs: no double count."""
    job = job_file(tmp_path, iops=100, runtime=2)
    wait_fio([start_fio(fio_bin, job, tmp_path / "vm.json")])
    truth = total_ios(tmp_path / "vm.json")
    packed = tmp_path / "vm.json.gz"
    packed.write_bytes(gzip.compress((tmp_path / "vm.json").read_bytes()))
    (tmp_path / "vm.json").unlink()
    log = tmp_path / "run_clat_hist.1.log"
    r = fiomon("report", packed, log)
    assert r.returncode != 0, "a gzipped json+ beside its own hist log must ask for --source"
    assert f"{packed} and 1 hist log(s): {log}" in r.stderr, r.stderr
    assert report_counts("--source", "json", packed, log) == {"": float(truth)}
    assert _hist_ok(report_counts("--source", "hist", packed, log)[""], truth)


def test_copies_of_an_input_are_read_once(tmp_path: Path, fio_bin: str) -> None:
    """A backup, a `gzip -k` copy and the original given together: their I/Os count once."""
    job = job_file(tmp_path, iops=100, runtime=2)
    wait_fio([start_fio(fio_bin, job, tmp_path / "vm.json")])
    truth = total_ios(tmp_path / "vm.json")
    stream, log = tmp_path / "vm.json", tmp_path / "run_clat_hist.1.log"
    backup = tmp_path / "vm.json.bak"
    backup.write_bytes(stream.read_bytes())
    packed = tmp_path / "run_clat_hist.1.log.gz"
    packed.write_bytes(gzip.compress(log.read_bytes()))
    r = fiomon("report", "--format", "jsonl", "--source", "json", stream, backup, log, packed)
    assert r.returncode == 0, r.stderr
    assert f"{backup} holds the same content as {stream}" in r.stderr, r.stderr
    assert f"{packed} holds the same content as {log}" in r.stderr, r.stderr
    assert report_counts("--source", "json", stream, backup, log, packed) == {"": float(truth)}
    hist = report_counts("--source", "hist", stream, backup, log, packed)[""]
    assert _hist_ok(hist, truth), (hist, truth)


def _three_hosts(tmp_path: Path, fio_bin: str) -> dict[str, Path]:
    """Three hosts' runs of one job file (numjobs=2, write_hist_log=run): host -> its folder."""
    hosts = {h: tmp_path / "runs" / h for h in ("client-01", "client-02", "client-03")}
    procs = []
    for i, folder in enumerate(hosts.values()):
        job = job_file(folder, iops=80 + 20 * i, runtime=2, rw="randrw", extra="numjobs=2")
        procs.append(start_fio(fio_bin, job, folder / "out.json"))
    wait_fio(procs)
    return hosts


def test_logs_renamed_when_collected_pair_with_their_stream(tmp_path: Path, fio_bin: str) -> None:
    """Results collected into one folder under the host's name, as people and `fiomon fio`
    name them: node1.json with node1_clat_hist.N.log (the prefix replaced), and
    client-0N-out.json with client-0N-run_clat_hist.N.log (the host put before it)."""
    hosts = _three_hosts(tmp_path, fio_bin)
    truth = {h: total_ios(folder / "out.json") for h, folder in hosts.items()}
    # node1.json and node1_clat_hist.N.log
    node = tmp_path / "node"
    node.mkdir()
    src = hosts["client-01"]
    (node / "node1.json").write_bytes((src / "out.json").read_bytes())
    for n in (1, 2):
        (node / f"node1_clat_hist.{n}.log").write_bytes(
            (src / f"run_clat_hist.{n}.log").read_bytes()
        )
    files = sorted(node.iterdir())
    r = fiomon("report", *files)
    assert r.returncode != 0, r.stderr
    assert f"{node / 'node1.json'} and 2 hist log(s)" in r.stderr
    assert report_counts("--source", "json", *files) == {"": float(truth["client-01"])}
    counted = report_counts("--source", "hist", *files)[""]
    assert truth["client-01"] - 2 * LAST_INTERVAL <= counted <= truth["client-01"], counted
    # client-0N-out.json and client-0N-run_clat_hist.N.log, all in one folder
    flat = tmp_path / "flat"
    flat.mkdir()
    for h, folder in hosts.items():
        (flat / f"{h}-out.json").write_bytes((folder / "out.json").read_bytes())
        for n in (1, 2):
            (flat / f"{h}-run_clat_hist.{n}.log").write_bytes(
                (folder / f"run_clat_hist.{n}.log").read_bytes()
            )
    files = sorted(flat.iterdir())
    r = fiomon("report", *files)
    assert r.returncode != 0, r.stderr
    for h in hosts:
        assert f"{flat / h}-out.json and 2 hist log(s): {flat / h}-run_clat_hist.1.log" in r.stderr
    everything = sum(truth.values())
    assert report_counts("--source", "json", *files) == {"": float(everything)}
    counted = report_counts("--source", "hist", *files)[""]
    print(f"collected flat, --source hist: {counted} against fio's {everything}")
    assert everything - 6 * LAST_INTERVAL <= counted <= everything, (counted, everything)
    # a host's logs without its stream pair with no other host's stream: read as its own
    alone = [p for p in files if p.name != "client-02-out.json"]
    counted = report_counts("--source", "json", *alone)[""]
    assert truth["client-01"] + truth["client-03"] < counted <= everything


def test_logs_in_a_sibling_folder_of_their_stream_pair_per_host(
    tmp_path: Path, fio_bin: str
) -> None:
    """client-0N/json/out.json with client-0N/hist/run_clat_hist.N.log: the logs pair with
    the stream of their own host's json/ folder, never another host's."""
    hosts = _three_hosts(tmp_path, fio_bin)
    truth = {h: total_ios(folder / "out.json") for h, folder in hosts.items()}
    split = tmp_path / "split"
    streams, logs = [], []
    for h, folder in hosts.items():
        (split / h / "json").mkdir(parents=True)
        (split / h / "hist").mkdir()
        streams.append(split / h / "json" / "out.json")
        streams[-1].write_bytes((folder / "out.json").read_bytes())
        for n in (1, 2):
            logs.append(split / h / "hist" / f"run_clat_hist.{n}.log")
            logs[-1].write_bytes((folder / f"run_clat_hist.{n}.log").read_bytes())
    files = streams + logs
    r = fiomon("report", "--per-host", *files)
    assert r.returncode != 0, r.stderr
    for h in hosts:
        assert f"{split / h / 'json' / 'out.json'} and 2 hist log(s)" in r.stderr
    assert report_counts("--per-host", "--source", "json", *files) == {
        h: float(n) for h, n in truth.items()
    }
    hist = report_counts("--per-host", "--source", "hist", *files)
    print(f"split json/ and hist/, --source hist: {hist} against fio's {truth}")
    assert set(hist) == set(hosts)
    for h in hosts:
        assert truth[h] - 2 * LAST_INTERVAL <= hist[h] <= truth[h], (h, hist[h], truth[h])
    # client-01's stream and client-02's logs: two hosts, not one host's two folders
    apart = [split / "client-01" / "json" / "out.json", *(split / "client-02" / "hist").iterdir()]
    other = tmp_path / "apart"
    for p in apart:
        host = "client-01" if p.suffix == ".json" else "client-02"
        (other / host).mkdir(parents=True, exist_ok=True)
        (other / host / p.name).write_bytes(p.read_bytes())
    files = sorted(other.glob("*/*"))
    r = fiomon("report", "--per-host", "--format", "jsonl", *files)
    assert r.returncode == 0, r.stderr
    assert "another host's folder" in r.stderr, r.stderr
    assert "no stream given holds its I/Os" not in r.stderr
    counted = report_counts("--per-host", *files)
    assert counted["client-01"] == float(truth["client-01"])
    assert truth["client-02"] - 2 * LAST_INTERVAL <= counted["client-02"] <= truth["client-02"]


def test_runs_appended_to_one_json_file_pair_with_each_runs_log(
    tmp_path: Path, fio_bin: str
) -> None:
    """`fio ... --output-format=json+ >> out.json` twice, the first run's log moved to run1/:
    each log pairs with its own run's last dump in the file (a restart: counts go down)."""
    job = job_file(tmp_path, iops=100, runtime=2)
    out = tmp_path / "out.json"
    truth = 0
    for run in (1, 2):
        with out.open("ab") as fh:
            ran = subprocess.run(
                [fio_bin, str(job), "--status-interval=1", "--output-format=json+"],
                cwd=tmp_path,
                stdout=fh,
                stderr=subprocess.PIPE,
                timeout=120,
                check=False,
            )
        assert ran.returncode == 0, ran.stderr
        truth += total_ios(out)  # the file's last document: this run's final one
        if run == 1:
            (tmp_path / "run1").mkdir()
            (tmp_path / "run_clat_hist.1.log").rename(tmp_path / "run1" / "run_clat_hist.1.log")
    logs = [tmp_path / "run1" / "run_clat_hist.1.log", tmp_path / "run_clat_hist.1.log"]
    files = [out, *logs]
    r = fiomon("report", *files)
    assert r.returncode != 0, r.stderr
    assert f"{out} and 2 hist log(s)" in r.stderr, r.stderr
    assert report_counts("--source", "json", *files) == {"": float(truth)}
    counted = report_counts("--source", "hist", *files)[""]
    print(f"two runs appended to one json+ file, --source hist: {counted} against {truth}")
    assert truth - 2 * LAST_INTERVAL <= counted <= truth, (counted, truth)
    # run 1's log alone: the stream is read whole (run 2 has no log), the log is not
    assert report_counts("--source", "hist", out, logs[0]) == {"": float(truth)}


def test_runs_appended_to_one_log_never_count_twice(tmp_path: Path, fio_bin: str) -> None:
    """per_job_logs=0 appends a second run to the first run's log: no view counts it twice.

    The log's first part is run 1's (out1.json holds it); its second part is run 2's,
    which out2.json holds too. --source json is exact; --source hist cannot split the
    log between the streams, so it is an error that says so, never a double count.
    """
    job = job_file(tmp_path, iops=100, runtime=2, extra="per_job_logs=0")
    wait_fio([start_fio(fio_bin, job, tmp_path / "out1.json")])
    wait_fio([start_fio(fio_bin, job, tmp_path / "out2.json")])
    truth = total_ios(tmp_path / "out1.json") + total_ios(tmp_path / "out2.json")
    log = tmp_path / "run_clat_hist.log"
    files = [tmp_path / "out1.json", tmp_path / "out2.json", log]
    assert report_counts("--source", "json", *files) == {"": float(truth)}
    r = fiomon("report", "--source", "hist", *files)
    assert r.returncode != 0, f"--source hist over a log of two runs must refuse: {r.stdout}"
    assert f"{log} (first part: {tmp_path / 'out1.json'})" in r.stderr, r.stderr
    assert "--source json" in r.stderr


def test_two_runs_writing_one_log_at_once_never_count_twice(tmp_path: Path, fio_bin: str) -> None:
    """Two runs at once with per_job_logs=0 and one prefix interleave their records in one log.

    Neither stream explains the log alone, both do together: it is theirs (asked without
    --source, left out by --source json, refused by --source hist), never I/Os of its own.
    """
    job = job_file(tmp_path, iops=100, runtime=3, extra="per_job_logs=0")
    procs = [start_fio(fio_bin, job, tmp_path / f"out{k}.json") for k in (1, 2)]
    wait_fio(procs)
    truth = total_ios(tmp_path / "out1.json") + total_ios(tmp_path / "out2.json")
    log = tmp_path / "run_clat_hist.log"
    files = [tmp_path / "out1.json", tmp_path / "out2.json", log]
    r = fiomon("report", *files)
    assert r.returncode != 0, f"both views given without --source must ask: {r.stdout}"
    assert str(log) in r.stderr, r.stderr
    assert report_counts("--source", "json", *files) == {"": float(truth)}
    r = fiomon("report", "--source", "hist", *files)
    assert r.returncode != 0, f"--source hist cannot split one log between runs: {r.stdout}"
    assert f"{log} (held by " in r.stderr, r.stderr


def test_group_reporting_on_the_command_line_pairs_every_threads_log(
    tmp_path: Path, fio_bin: str
) -> None:
    """``fio --numjobs=3 --group_reporting``: fio 3.33's json+ lists group_reporting in
    neither its global nor its job options, one entry folds the three threads, and each
    thread writes its hist log. Thread 2's and 3's logs were "I/Os of their own" beside
    the stream: every I/O counted twice (a third of them: h_clat_hist.1.log), exit 0.
    """
    subprocess.run(
        [
            fio_bin,
            "--name=j",
            "--ioengine=psync",
            "--rw=randread",
            "--bs=4k",
            "--size=1m",
            f"--filename={tmp_path / 'data'}",
            "--time_based",
            "--runtime=2",
            "--rate_iops=100",
            "--numjobs=3",
            "--group_reporting",
            "--write_hist_log=h",
            "--log_hist_msec=250",
            "--log_unix_epoch=1",
            "--status-interval=1",
            "--output-format=json+",
            f"--output={tmp_path / 'out.json'}",
        ],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=DEADLINE_S,
    )
    hist = sorted(tmp_path.glob("h_clat_hist.*.log"))
    assert len(hist) == 3
    files = [tmp_path / "out.json", *hist]
    for given in (files, files[:2]):
        r = fiomon("report", *given)
        assert r.returncode != 0, r.stdout
        assert f"and {len(given) - 1} hist log(s)" in r.stderr  # every log paired: asks
    assert report_counts("--source", "json", *files) == {"": float(total_ios(files[0]))}
