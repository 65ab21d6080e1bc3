"""Judging what fiomon counted against fio's own totals, with messages that say everything."""

from __future__ import annotations

import json
import shlex
from typing import Any

from tests.conformance.harness import Outcome, Results
from tests.conformance.matrix import Expect, View

EPS = 1e-6  # records split over quanta leave fractions; their sum is whole to this


def pick(counted: dict[str, float], key: str) -> float:
    """The I/Os of host key ``key`` (``*`` all hosts, ``a|b`` the sum of a and b)."""
    if key == "*":
        return sum(counted.values())
    return sum(counted.get(h, 0.0) for h in key.split("|"))


def judge(expect: Expect, counted: dict[str, float]) -> list[str]:
    """Per host key, what is wrong with the counts (empty: all right)."""
    bad = []
    for key, truth in expect.truth.items():
        got = pick(counted, key)
        if expect.kind == "exact":
            if abs(got - truth) > EPS * max(1, truth):
                bad.append(f"{key}: fio total_ios {truth}, counted {got:g} (must be equal)")
        elif key in expect.hist:
            held = expect.hist[key]
            if abs(got - held) > EPS * max(1, held):
                bad.append(
                    f"{key}: fio total_ios {truth}, its hist logs hold {held} (every record "
                    f"once; they lack each job's last partial interval), counted {got:g}"
                )
        else:  # fio --client logs (running sums): only the bound
            bound = expect.bound.get(key, 0.0)
            missing = truth - got
            if not -EPS * max(1, truth) <= missing <= bound + EPS:
                bad.append(
                    f"{key}: fio total_ios {truth}, counted {got:g}: missing {missing:g}, "
                    f"allowed 0..{bound:g} (hist logs lack each job's last partial interval)"
                )
    return bad


def report_hosts(stdout: str) -> dict[str, float]:
    """``report --format jsonl --per-host``: samples per host, direction all."""
    out: dict[str, float] = {}
    for line in stdout.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        r = json.loads(line)
        if r.get("scope") == "host" and r.get("direction") == "all":
            out[str(r["host"])] = out.get(str(r["host"]), 0.0) + float(r["samples"])
    return out


def summary_total(stdout: str) -> dict[str, float]:
    """``summary --format json``: the I/Os of operation ``all`` (else of every operation)."""
    ops: list[dict[str, Any]] = json.loads(stdout)
    by = {str(o["operation"]): float(o["ios"]) for o in ops}
    return {"*": by["all"] if "all" in by else sum(by.values())}


def describe(case: str, o: Outcome) -> str:
    err = o.stderr.strip()
    if len(err) > 1500:
        err = err[:700] + "\n...\n" + err[-700:]
    return f"[{case}] $ {shlex.join(o.cmd)}\nexit {o.returncode}; stderr:\n{err}"


def counted_of(v: View, o: Outcome) -> dict[str, float]:
    return report_hosts(o.stdout) if v.tool == "report" else summary_total(o.stdout)


def offline_problems(v: View, o: Outcome) -> list[str]:
    """What is wrong with one offline command's answer (empty: right)."""
    if v.expect.kind == "refuse":
        if o.returncode == 0:
            return [f"must be refused, exit 0 with:\n{o.stdout[:500]}"]
        low = o.stderr.lower()
        bad = []
        if "Traceback" in o.stderr:
            bad.append("a traceback instead of a message")
        missing = [n for n in v.expect.names if n.lower() not in low]
        if missing:
            bad.append(f"the message does not name {missing}")
        if not any(w.lower() in low for w in v.expect.words):
            bad.append(f"the message says none of {list(v.expect.words)} (what fixes it)")
        return bad
    if o.returncode != 0:
        return ["fiomon failed on fio's output"]
    counted = counted_of(v, o)
    bad = judge(v.expect, counted)
    return [*bad, f"counted per host: {counted}"] if bad else []


def unexplained(log: str, names: tuple[str, ...], words: tuple[str, ...]) -> list[str]:
    """Files no line of the agent's log both names and explains (one of ``words``)."""
    lines = log.lower().splitlines()
    return [
        n
        for n in names
        if not any(n.lower() in ln and any(w.lower() in ln for w in words) for ln in lines)
    ]


def live_problems(res: Results, case: str) -> list[str]:
    """What is wrong with the live rows of ``case`` (empty: right)."""
    expect = res.live[case]
    counted = res.live_hosts()
    # (paths hold the case's name, which may be one of the words: "compressed")
    log = res.agent_logs.get(case, "").replace(str(res.root / "cases" / case), "<case>")
    got = sum(pick(counted, k) for k in expect.truth)
    if expect.kind == "refuse":
        bad = []
        if got != 0:
            bad.append(f"published {got:g} I/Os of a file it cannot read")
        unsaid = unexplained(log, expect.names, expect.words)
        if unsaid:
            bad.append(
                f"the agent's log does not say what {unsaid} are (one of {list(expect.words)})"
            )
        return bad
    if expect.kind == "hist-or-refuse" and got == 0:
        unsaid = unexplained(log, expect.names, expect.words)
        if unsaid:
            return [
                f"published nothing of {list(expect.names)} and did not say what {unsaid} "
                f"are (one of {list(expect.words)}); fio total_ios {sum(expect.truth.values())}"
            ]
        return []
    return judge(expect, counted)


def table(res: Results) -> str:
    """One line per offline view and per live case: fio's totals, what fiomon counted."""
    rows = [
        f"{'case':24} {'view':16} {'kind':14} {'fio total_ios':>13} {'logs hold':>9} "
        f"{'counted':>10}  verdict"
    ]

    def row(case: str, view: str, e: Expect, got: str, ok: bool) -> None:
        truth = str(sum(e.truth.values())) if e.truth else "-"
        held = str(sum(e.hist.values())) if e.hist else "-"
        rows.append(
            f"{case:24} {view:16} {e.kind:14} {truth:>13} {held:>9} {got:>10}  "
            f"{'ok' if ok else 'WRONG'}"
        )

    for (case, view), v in sorted(res.views.items()):
        o = res.offline[(case, view)]
        if o.returncode != 0:
            got = f"exit {o.returncode}"
        else:
            got = f"{sum(counted_of(v, o).values()):.6g}"
        row(case, view, v.expect, got, not offline_problems(v, o))
    live = res.live_hosts()
    for case, e in sorted(res.live.items()):
        got = f"{sum(pick(live, k) for k in e.truth):.6g}"
        row(case, "live", e, got, not live_problems(res, case))
    for case, err in sorted(res.errors.items()):
        rows.append(f"{case:24} {'(fio run)':16} error: {err.strip().splitlines()[-1]}")
    return "\n".join(rows)
