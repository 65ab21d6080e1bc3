"""Heavy-tail fit of a latency histogram: a normal head plus a power-law tail.

Model (the shape measured on production parallel file systems): a latency is, with
probability ``1 - w``, normal (``mu``, ``sigma``: the head) and with probability ``w``
Pareto with density ``p(x) = (alpha - 1) / x_min * (x / x_min) ** -alpha`` for
``x >= x_min`` (the tail; ``alpha`` is the density exponent, ``alpha - 1`` the tail index).

Fitting works on fio's bins directly (numpy only):

* for a pivot ``x_min``, the mixture's maximum-likelihood parameters come from EM on the
  binned counts (the responsibilities split each bin between head and tail; the head is
  refit by weighted moments, ``alpha`` by the weighted continuous MLE
  ``1 + n / sum(log(x / x_min))`` at bin midpoints, exact to the bins' 1.6 % width);
* the pivot is the candidate (bin edges between the median and the 99.9th percentile)
  whose fitted mixture has the smallest Kolmogorov-Smirnov distance to the data;
* the tail, the data above the pivot, is then also fitted by a (truncated) lognormal, a
  shifted exponential and a shifted Weibull; each model's KS distance on the tail is
  reported and the smallest wins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout
from fiomon.errors import FitError
from fiomon.units import format_latency_ns

F64 = npt.NDArray[np.float64]
MIN_IOS = 100
EM_ROUNDS = 200


@dataclass(frozen=True, slots=True)
class TailModel:
    """One candidate model of the tail.

    Args:
        name: ``power-law``, ``lognormal``, ``exponential`` or ``weibull``.
        params: its parameters (ns where they are latencies).
        ks: Kolmogorov-Smirnov distance to the data above the pivot.
    """

    name: str
    params: dict[str, float]
    ks: float


@dataclass(frozen=True, slots=True)
class Fit:
    """The fitted head + tail mixture and the tail's model comparison.

    Args:
        ios: I/Os in the histogram.
        head_mean_ns: the normal head's mean.
        head_sd_ns: its standard deviation.
        tail_share: the tail component's share of the I/Os (0..1).
        x_min_ns: the pivot, where the power law starts.
        alpha: the power law's density exponent (p(x) ~ x**-alpha).
        ks: KS distance of the whole mixture to the data.
        tail_models: every tail model, best first.
    """

    ios: float
    head_mean_ns: float
    head_sd_ns: float
    tail_share: float
    x_min_ns: float
    alpha: float
    ks: float
    tail_models: tuple[TailModel, ...]

    @property
    def winner(self) -> str:
        """The tail model with the smallest KS distance."""
        return self.tail_models[0].name

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return {
            "ios": self.ios,
            "head": {"mean_ns": self.head_mean_ns, "sd_ns": self.head_sd_ns},
            "tail_share": self.tail_share,
            "x_min_ns": self.x_min_ns,
            "alpha": self.alpha,
            "tail_index": self.alpha - 1,
            "ks": self.ks,
            "tail_models": [
                {"model": m.name, "ks": m.ks, "params": m.params} for m in self.tail_models
            ],
            "winner": self.winner,
        }


def _norm_cdf(x: F64, mu: float, sigma: float) -> F64:
    z = (x - mu) / (sigma * math.sqrt(2.0))
    out: F64 = 0.5 * (1.0 + _erf(z))
    return out


def _erf(x: F64) -> F64:
    """Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7), vectorised; numpy has no erf."""
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    out: F64 = s * (1.0 - poly * np.exp(-a * a))
    return out


def _pareto_cdf(x: F64, x_min: float, alpha: float) -> F64:
    out: F64 = np.where(x < x_min, 0.0, 1.0 - (np.maximum(x, x_min) / x_min) ** (1.0 - alpha))
    return out


@dataclass(frozen=True, slots=True)
class _Data:
    counts: F64
    lower: F64
    upper: F64
    mids: F64
    total: float
    ecdf_upper: F64  # empirical CDF at each bin's upper edge


def _data(hist: F64, layout: BinLayout) -> _Data:
    lower, upper = layout.edges_ns()
    counts = np.asarray(hist, dtype=np.float64)
    total = float(counts.sum())
    if total < MIN_IOS:
        msg = f"{total:.0f} I/Os: too few to fit (at least {MIN_IOS})"
        raise FitError(msg)
    occupied = np.flatnonzero(counts > 0)
    if len(occupied) < 3:
        msg = f"the I/Os fall in {len(occupied)} bin(s): nothing to fit a distribution to"
        raise FitError(msg)
    if counts[-1] > 0.5 * total:
        msg = "most I/Os are in fio's last bin (above its ~17 s cap): their latencies are unknown"
        raise FitError(msg)
    # The last bin is clamped (its values unknown); empty bins outside the data cost time
    # and carry no likelihood.
    last = min(int(occupied[-1]), len(counts) - 2) + 1
    keep = slice(int(occupied[0]), max(last, int(occupied[0]) + 1))
    c = counts[keep]
    return _Data(
        c,
        lower[keep],
        upper[keep],
        0.5 * (lower[keep] + upper[keep]),
        float(c.sum()),
        np.cumsum(c) / float(c.sum()),
    )


def _em(d: _Data, x_min: float) -> tuple[float, float, float, float, F64]:
    """Mixture parameters (mu, sigma, w, alpha) for the pivot ``x_min`` by binned EM.

    Also returns each bin's tail responsibility (its share that the tail explains).
    """
    above = d.lower >= x_min
    head = ~above
    n_head = float(d.counts[head].sum())
    n_tail = float(d.counts[above].sum())
    if n_head <= 0 or n_tail <= 0:
        msg = "pivot leaves no head or no tail"
        raise FitError(msg)
    mu = float((d.counts[head] * d.mids[head]).sum() / n_head)
    sigma = math.sqrt(max(float((d.counts[head] * (d.mids[head] - mu) ** 2).sum() / n_head), 1.0))
    w = n_tail / d.total
    logs = np.log(np.maximum(d.mids, x_min) / x_min)
    alpha = 1.0 + n_tail / max(float((d.counts[above] * logs[above]).sum()), 1e-12)
    r = above.astype(np.float64)
    edges = np.r_[d.lower[0], d.upper]
    for _ in range(EM_ROUNDS):
        prev = (w, alpha)
        pn = np.diff(_norm_cdf(edges, mu, sigma))
        pt = np.diff(_pareto_cdf(edges, x_min, alpha))
        mix = (1 - w) * pn + w * pt
        r = np.where(mix > 0, w * pt / np.where(mix > 0, mix, 1.0), above.astype(np.float64))
        wt = d.counts * r
        wh = d.counts - wt
        w = float(wt.sum() / d.total)
        sh = float(wh.sum())
        if sh <= 0 or w <= 0:
            break
        mu = float((wh * d.mids).sum() / sh)
        sigma = math.sqrt(max(float((wh * (d.mids - mu) ** 2).sum() / sh), 1.0))
        denom = float((wt * logs).sum())
        alpha = 1.0 + float(wt.sum()) / max(denom, 1e-12)
        if abs(w - prev[0]) < 1e-7 and abs(alpha - prev[1]) < 1e-6:
            break
    return mu, sigma, w, alpha, r


def _mixture_ks(d: _Data, *params: float) -> float:
    mu, sigma, w, x_min, alpha = params
    model = (1 - w) * _norm_cdf(d.upper, mu, sigma) + w * _pareto_cdf(d.upper, x_min, alpha)
    return float(np.max(np.abs(model - d.ecdf_upper)))


def fit_histogram(hist: F64, layout: BinLayout, candidates: int = 32) -> Fit:
    """Fit the head + tail mixture to one fio histogram.

    Raises:
        FitError: too few I/Os, a single bin, or mostly saturated (the message says).
    """
    d = _data(np.asarray(hist, dtype=np.float64), layout)
    cum = d.ecdf_upper
    lo_i = int(np.searchsorted(cum, 0.5))
    hi_i = int(np.searchsorted(cum, 0.999))
    edges = np.unique(d.lower[lo_i : max(hi_i, lo_i + 1) + 1])
    if len(edges) > candidates:
        edges = edges[np.unique(np.linspace(0, len(edges) - 1, candidates).round().astype(int))]
    tried: dict[float, tuple[float, float, float, float, float, F64]] = {}

    def consider(x_min: float) -> None:
        if x_min in tried:
            return
        try:
            mu, sigma, w, alpha, r = _em(d, x_min)
        except FitError:
            return
        tried[x_min] = (_mixture_ks(d, mu, sigma, w, x_min, alpha), mu, sigma, w, alpha, r)

    # A coarse pass over the candidates, then every bin edge around the three best (the
    # KS distance is not smooth in the pivot, and a heavy tail spreads candidates thin).
    for x in edges.tolist():
        consider(float(x))
    for x_best in sorted(tried, key=lambda k: tried[k][0])[:3]:
        i = int(np.searchsorted(edges, x_best))
        lo, hi = edges[max(i - 1, 0)], edges[min(i + 1, len(edges) - 1)]
        for x in d.lower[(d.lower > lo) & (d.lower < hi)].tolist():
            consider(float(x))
    best = None
    if tried:
        x_min = min(tried, key=lambda k: tried[k][0])
        ks_, mu_, sigma_, w_, alpha_, r_ = tried[x_min]
        best = (ks_, mu_, sigma_, w_, x_min, alpha_, r_)
    if best is None:
        msg = "no pivot separates a head from a tail"
        raise FitError(msg)
    ks, mu, sigma, w, x_min, alpha, r = best
    models = _tail_models(d, x_min, alpha, d.counts * r)
    return Fit(float(hist.sum()), mu, sigma, w, x_min, alpha, ks, models)


def _tail_models(d: _Data, x_min: float, alpha: float, tail_counts: F64) -> tuple[TailModel, ...]:
    """Power law, lognormal, exponential and Weibull on the tail component.

    The tail is the counts the fitted mixture gives the tail (head I/Os above the pivot
    left out), above the pivot.
    """
    sel = (d.lower >= x_min) & (tail_counts > 0)
    c, up, mid = tail_counts[sel], d.upper[sel], d.mids[sel]
    n = float(c.sum())
    if n <= 0:
        return (TailModel("power-law", {"x_min_ns": x_min, "alpha": alpha}, 0.0),)
    ecdf = np.cumsum(c) / n
    out = [
        TailModel(
            "power-law",
            {"x_min_ns": x_min, "alpha": alpha},
            _ks(_pareto_cdf(up, x_min, alpha), ecdf),
        )
    ]
    # Shifted exponential: MLE rate 1 / mean excess.
    excess = max(float((c * (mid - x_min)).sum() / n), 1e-9)
    expo = 1.0 - np.exp(-(up - x_min) / excess)
    out.append(
        TailModel("exponential", {"x_min_ns": x_min, "mean_excess_ns": excess}, _ks(expo, ecdf))
    )
    # Lognormal truncated at the pivot: log-moments of the tail, then the conditional CDF.
    logs = np.log(mid)
    m = float((c * logs).sum() / n)
    s = math.sqrt(max(float((c * (logs - m) ** 2).sum() / n), 1e-12))
    f = _norm_cdf(np.log(up), m, s)
    f0 = float(_norm_cdf(np.array([math.log(x_min)]), m, s)[0])
    logn = (f - f0) / max(1.0 - f0, 1e-12)
    out.append(TailModel("lognormal", {"mu_log": m, "sigma_log": s}, _ks(logn, ecdf)))
    # Shifted Weibull: least squares on the Weibull plot, log(-log(1 - F)) vs log(x - x_min).
    ok = (ecdf > 0) & (ecdf < 1) & (up > x_min)
    if ok.sum() >= 2:
        xs = np.log(up[ok] - x_min)
        ys = np.log(-np.log1p(-ecdf[ok]))
        k, b = np.polyfit(xs, ys, 1, w=np.sqrt(c[ok]))
        k = max(float(k), 1e-3)
        lam = math.exp(-float(b) / k)
        weib = 1.0 - np.exp(-((np.maximum(up - x_min, 0.0) / lam) ** k))
        out.append(
            TailModel("weibull", {"x_min_ns": x_min, "shape": k, "scale_ns": lam}, _ks(weib, ecdf))
        )
    return tuple(sorted(out, key=lambda m: m.ks))


def _ks(model: F64, ecdf: F64) -> float:
    return float(np.max(np.abs(model - ecdf)))


def describe(label: str, f: Fit) -> str:
    """Two lines for a person."""
    models = "  ".join(f"{m.name} {m.ks:.4f}" for m in f.tail_models)
    mean, sd, x_min = (
        format_latency_ns(ns, largest="ms") for ns in (f.head_mean_ns, f.head_sd_ns, f.x_min_ns)
    )
    return (
        f"{label}: {f.ios:,.0f} I/Os; head normal(mean {mean}, sd {sd}); tail "
        f"{f.tail_share:.2%} power law from {x_min}, alpha {f.alpha:.3f} (tail index "
        f"{f.alpha - 1:.3f}); "
        f"KS {f.ks:.4f}\n"
        f"  tail models by KS distance: {models}; winner: {f.winner}\n"
    )
