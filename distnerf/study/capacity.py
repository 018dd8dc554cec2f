"""Does quality depend on capacity, and does it grow with the ranks? The capacity study's statistics.

Two tables of a study (``conf/study/capacity.yaml``), built from the cells' summaries
(:func:`distnerf.study.report.collect`):

* **capacity curve** (:func:`capacity_rows`): the world-size-1 ``ddp`` cells, one row per
  ``budget`` level (``model.max_params``): test PSNR mean and sample standard deviation over
  the repeats (seeds), the gain in dB per doubling of parameters between neighbouring budgets
  (``(PSNR_b - PSNR_a) / log2(params_b / params_a)``) and the plateau check of every repeat
  (:func:`plateau_gain`, under a learning rate not decayed below a tenth of its start:
  :func:`lr_share`): capacity limits quality where the curve still rises *at a plateau*.
* **PSNR against ranks** (:func:`ranks_rows`): at each budget that has cells at W > 1, every
  strategy's PSNR mean and sd against world size, with the gain per doubling of ranks from the
  previous world size (``(PSNR_W - PSNR_V) / log2(W / V)``) and the difference to W = 1. The W = 1
  point of ``ss`` is its own W = 1 cell when the study has one, else the ``ddp`` cell (one region
  is one model: the same run).

Targets (the capacity issue; printed met / missed, never rounded): the capacity curve rises by
:data:`CAPACITY_TARGET_DB` per doubling around the ranks budget; ``ss`` joint gains
:data:`JOINT_TARGET_DB` per doubling of ranks while ``ddp`` stays within
:data:`DDP_BAND_DB` of W = 1.
"""
from __future__ import annotations

import math
import statistics

PLATEAU_FRACTION = 0.2  # a plateau: the last 20% of the steps ...
PLATEAU_GAIN_DB = 0.2   # ... gain less than this much PSNR ...
PLATEAU_MIN_LR_SHARE = 0.1  # ... while the learning rate is still at least this share of its start
CAPACITY_TARGET_DB = 1.5  # dB per doubling of parameters around the chosen budget
JOINT_TARGET_DB = 1.0     # dB per doubling of ranks, ss joint
DDP_BAND_DB = 0.3         # ddp at every world size within this of W = 1


def value_at(curve: list[tuple[float, float]], x: float) -> float:
    """Linear interpolation of a curve of (x, y) points sorted by x at ``x`` (clamped to its ends).

    Raises:
        ValueError: an empty curve.
    """
    if not curve:
        raise ValueError("value_at: the curve has no point")
    if x <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return curve[-1][1]


def plateau_gain(curve: list[tuple[float, float]], fraction: float = PLATEAU_FRACTION) -> float | None:
    """PSNR gained over the last ``fraction`` of a run's steps: the rise of the least-squares line through
    the validations in that window, ``slope x fraction x N``.

    At a constant learning rate the validation PSNR of a model at its plateau still moves from one
    validation to the next (residual sd 0.08 dB about the trend at 125-250 k parameters on ``detail``,
    every 500 steps: ``conf/study/capacity_plateau.yaml``), so the difference of two single validations
    ``y(N) - y((1 - fraction) N)`` has a noise sd of about 0.11 dB against a 0.2 dB threshold; the
    fitted line uses every validation in the window. The window's first point is the curve at
    ``(1 - fraction) N`` (interpolated linearly between validations when none lies there), so a window
    with one validation besides it gives exactly the two-point difference, and so do three equally
    spaced ones spanning it.

    Args:
        curve: (step, PSNR dB) points of one run (its validations), any order; N is the last step.
        fraction: the share of the steps at the end (0.2: the last 20 %).
    Returns:
        the gain in dB, or None when no point lies at or before step ``(1 - fraction) N`` (the curve
        cannot tell).
    """
    pts = sorted((float(s), float(v)) for s, v in curve)
    if not pts:
        return None
    start = (1.0 - fraction) * pts[-1][0]
    if pts[0][0] > start:
        return None
    window = [p for p in pts if p[0] >= start]
    if window[0][0] > start:
        window.insert(0, (start, value_at(pts, start)))
    if len(window) < 2:  # a run of one validation
        return 0.0
    return statistics.linear_regression(*zip(*window)).slope * (pts[-1][0] - start)


def lr_share(curve: list[tuple[float, float | None]], fraction: float = PLATEAU_FRACTION) -> float | None:
    """The learning rate where the plateau window starts, as a share of the run's first logged one.

    A flat validation curve under a learning rate that has decayed to a few percent of its start
    is no evidence that the model holds all it can: it has stopped moving. On the built-in
    ``detail`` scene, cells whose last 20% gained < 0.1 dB at a share of 0.025 gained 2.4 dB more
    when trained 4x longer with the schedule stretched (bench/history/README.md, the table study_capacity_stretch).

    Args:
        curve: (step, lr) points of one run (its training log), any order; points without an lr skipped.
        fraction: the plateau window's share of the steps.
    Returns:
        ``lr(step nearest (1 - fraction) N) / lr(first step)``, or None without two logged rates.
    """
    pts = sorted((float(s), float(v)) for s, v in curve if v is not None)
    if len(pts) < 2 or pts[0][1] <= 0:
        return None
    start = (1.0 - fraction) * pts[-1][0]
    return min(pts, key=lambda p: abs(p[0] - start))[1] / pts[0][1]


def mean_sd(values) -> tuple[float | None, float | None, int]:
    """(mean, sample standard deviation (n - 1), n) of the values that are not None; sd None when n < 2."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return None, None, 0
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None), len(vals)


def per_doubling(x0: float, y0: float, x1: float, y1: float) -> float | None:
    """Gain of y per doubling of x between two points: ``(y1 - y0) / log2(x1 / x0)`` (None if x0 == x1)."""
    if not x0 or not x1 or x0 == x1 or y0 is None or y1 is None:
        return None
    return (y1 - y0) / math.log2(x1 / x0)


def _ws(s: dict) -> int:
    return int(s["values"].get("world_size") or 1)


CURVE_AXES = ("budget", "strategy", "world_size")
"""The axes a capacity curve or a PSNR-against-ranks row varies; every other axis (scene, sampler, ...)
is its *context*: cells of different contexts are never compared."""


def context(values: dict) -> str:
    """The context label of a cell's axis values: its levels on the axes outside
    :data:`CURVE_AXES` (``"sampler=pipelined, scene=lego"``; empty when there are none)."""
    return ", ".join(f"{k}={values[k]}" for k in sorted(values) if k not in CURVE_AXES and values[k] is not None)


def capacity_rows(keys: dict) -> list[dict]:
    """The capacity curve: one row per budget of the world-size-1 ``ddp`` cells, by parameters, one
    curve per :func:`context` that has at least two budgets.

    Args:
        keys: {cell key: summary} with ``values``, ``n``, ``psnrs``, ``plateau_gains``,
            ``parameters_per_rank``, ``constant_psnr``, ``steps`` (see ``report._summarise``).
    Returns:
        rows with ``context``, ``budget``, ``params_per_rank``, ``psnr_mean``, ``psnr_sd``, ``n``, ``steps``,
        ``gain_last_max`` (the largest repeat's plateau gain, dB), ``lr_share_min`` (the smallest
        repeat's :func:`lr_share`, None when the logs carry no rate), ``plateau`` (every repeat's gain
        known and < :data:`PLATEAU_GAIN_DB`, and no repeat's learning rate below
        :data:`PLATEAU_MIN_LR_SHARE` of its start there), ``constant_psnr``, ``db_per_doubling`` (from the
        previous row; None on the first) and ``db_per_doubling_around`` (mean of the slopes on
        both sides of the row, where they exist); empty with fewer than two budgets.
    """
    curves: dict[str, list[dict]] = {}
    for s in keys.values():
        v = s["values"]
        if not s.get("n") or v.get("strategy") not in (None, "ddp") or _ws(s) != 1 or v.get("budget") is None:
            continue
        mean, sd, n = mean_sd(s.get("psnrs", []))
        gains = s.get("plateau_gains") or []
        known = [g for g in gains if g is not None]
        shares = [x for x in (s.get("plateau_lr_shares") or []) if x is not None]
        params = s.get("parameters_per_rank")
        curves.setdefault(context(v), []).append({
            "context": context(v), "budget": v["budget"], "cell": s.get("key"),
            "params_per_rank": None if params is None else float(params),
            "psnr_mean": mean, "psnr_sd": sd, "n": n, "steps": s.get("steps"),
            "gain_last_max": max(known) if known else None,
            "plateau": bool(gains) and len(known) == len(gains) and max(known) < PLATEAU_GAIN_DB
                       and not (shares and min(shares) < PLATEAU_MIN_LR_SHARE),
            "lr_share_min": min(shares) if shares else None,
            "constant_psnr": s.get("constant_psnr")})
    out = []
    for label in sorted(curves):
        rows = curves[label]
        if len({r["budget"] for r in rows}) < 2:  # one budget in this context: no curve
            continue
        rows.sort(key=lambda r: r["params_per_rank"] or 0)
        for prev, row in zip([None, *rows], rows):
            row["db_per_doubling"] = None if prev is None else per_doubling(
                prev["params_per_rank"], prev["psnr_mean"], row["params_per_rank"], row["psnr_mean"])
        for i, row in enumerate(rows):
            sides = [r["db_per_doubling"] for r in rows[i:i + 2] if r["db_per_doubling"] is not None]
            row["db_per_doubling_around"] = statistics.fmean(sides) if sides else None
        out.extend(rows)
    return out


def ranks_rows(keys: dict) -> list[dict]:
    """PSNR against world size per strategy, at every budget and :func:`context` with cells at W > 1
    (cells of different scenes or samplers are never compared).

    Returns:
        rows with ``context``, ``budget``, ``strategy``, ``world_size``, ``psnr_mean``, ``psnr_sd``, ``n``,
        ``source`` (the cell key, or the ddp cell standing in at W = 1), ``steps``, ``db_per_doubling`` (from
        the previous world size of the same strategy, ``from_world_size``), ``delta_vs_w1``, ``step_ms`` (the
        median step time over the cell's seeds, ms; an untimed study's shares the machine) and
        ``segments_per_ray`` (ray segments a rank marches per training ray: the mean regions a ray crosses
        under joint ``ss``, where each rank renders its regions' segments of every ray; 1 otherwise); sorted by
        budget, strategy, world size.
    """
    done = [s for s in keys.values() if s.get("n")]
    groups = sorted({(context(s["values"]), s["values"].get("budget")) for s in done if _ws(s) > 1}, key=str)
    rows = []
    for label, budget in groups:
        at = [s for s in done if s["values"].get("budget") == budget and context(s["values"]) == label]
        for strategy in sorted({s["values"].get("strategy") for s in at if _ws(s) > 1}, key=str):
            points = {}
            for s in at:
                if s["values"].get("strategy") == strategy:
                    points[_ws(s)] = (s, s["key"])
            if 1 not in points:
                ddp1 = next((s for s in at if s["values"].get("strategy") == "ddp" and _ws(s) == 1
                             and _same_but(s["values"], points[max(points)][0]["values"])), None)
                if ddp1 is not None:
                    points[1] = (ddp1, f"{ddp1['key']} (ddp: one model is one region)")
            base, prev = None, None
            for w in sorted(points):
                s, source = points[w]
                mean, sd, n = mean_sd(s.get("psnrs", []))
                row = {"context": label, "budget": budget, "strategy": strategy, "world_size": w, "psnr_mean": mean, "psnr_sd": sd,
                       "n": n, "source": source, "params_per_rank": (None if s.get("parameters_per_rank") is None
                                                                      else float(s["parameters_per_rank"])),
                       "steps": s.get("steps"), "from_world_size": None if prev is None else prev[0],
                       "db_per_doubling": None if prev is None else per_doubling(prev[0], prev[1], w, mean),
                       "delta_vs_w1": None if base is None or mean is None else mean - base,
                       "step_ms": None if s.get("step_s_median") is None else 1e3 * s["step_s_median"],
                       "segments_per_ray": _segments_per_ray(s)}
                if w == 1:
                    base = mean
                prev = (w, mean)
                rows.append(row)
    return rows


def _segments_per_ray(s: dict) -> float | None:
    """Ray segments a rank marches per training ray in the cell summary ``s`` (:func:`ranks_rows`)."""
    if s.get("training") == "joint" or s["values"].get("strategy") == "ss_joint":
        return s.get("regions_crossed_mean")
    return 1.0


def annotate_equal_total(ranks: list[dict], curve: list[dict], tolerance: float = 0.15) -> None:
    """Beside each row of :func:`ranks_rows`, the one-rank ``ddp`` cell of the capacity curve whose
    parameters are W times the row's per rank (within ``tolerance``): ``single_equal_total_psnr`` (its
    mean) and ``vs_single_equal_total`` (the row's PSNR minus it): the ranks' extra capacity given to
    one model instead, at one rank's rays per step; ``single_equal_total_params`` and ``single_equal_total_sd`` that
    cell's parameters and PSNR spread over its seeds. None where the curve has no such budget, or has it
    trained for other steps than the row (a curve cell trained longer to reach its plateau is no
    equal-steps reference)."""
    for row in ranks:
        want = (row.get("params_per_rank") or 0) * row["world_size"]
        match = next((c for c in curve if want and c["params_per_rank"]
                      and abs(c["params_per_rank"] - want) <= tolerance * want
                      and (c.get("steps") is None or row.get("steps") is None or c["steps"] == row["steps"])), None)
        row["single_equal_total_psnr"] = match["psnr_mean"] if match else None
        row["single_equal_total_params"] = match["params_per_rank"] if match else None
        row["single_equal_total_sd"] = match["psnr_sd"] if match else None
        row["vs_single_equal_total"] = (row["psnr_mean"] - match["psnr_mean"]
                                        if match and row["psnr_mean"] is not None else None)


def _same_but(a: dict, b: dict) -> bool:
    """Two cells' axis values equal except strategy and world size."""
    return all(a.get(k) == b.get(k) for k in set(a) | set(b) if k not in ("strategy", "world_size"))


def verdicts(capacity: list[dict], ranks: list[dict]) -> list[str]:
    """The targets, each 'met' or 'missed' with the figure (the capacity issue's three)."""
    out = []
    groups = sorted({(r.get("context", ""), r["budget"]) for r in ranks}, key=str)
    if not groups:  # a curve alone (conf/study/capacity_plateau.yaml): every budget with a neighbour on each side
        groups = [(label, r["budget"]) for label in sorted({r.get("context", "") for r in capacity})
                  for r in _curve(capacity, label)[1:-1]]
    for label, budget in groups:
        where = f"{budget}" + (f" ({label})" if label else "")
        row = next((r for r in capacity if r["budget"] == budget and r.get("context", "") == label), None)
        if row is not None:
            out.append(_capacity_verdict(capacity, row, where))
        at = [r for r in ranks if r["budget"] == budget and r.get("context", "") == label]
        for r in at:
            if r["strategy"] == "ss_joint" and r["db_per_doubling"] is not None:
                out.append(f"ss joint at {where}, W {r['from_world_size']} -> "
                           f"{r['world_size']}: {r['db_per_doubling']:+.2f} dB per doubling of ranks (target >= "
                           f"{JOINT_TARGET_DB} dB): {_met(r['db_per_doubling'] >= JOINT_TARGET_DB)}")
        for r in at:
            if r["strategy"] == "ddp" and r["delta_vs_w1"] is not None and r["world_size"] > 1:
                out.append(f"ddp at {where}, W = {r['world_size']}: {r['delta_vs_w1']:+.2f} dB from W = 1 (target "
                           f"within +-{DDP_BAND_DB} dB): {_met(abs(r['delta_vs_w1']) <= DDP_BAND_DB)}")
    return out


def _curve(capacity: list[dict], label: str) -> list[dict]:
    """The capacity rows of one context, in :func:`capacity_rows`' order (by parameters)."""
    return [r for r in capacity if r.get("context", "") == label]


def _capacity_verdict(capacity: list[dict], row: dict, where: str) -> str:
    """The capacity target at one budget: the mean slope of its two sides, every point of it at a plateau."""
    slope = row["db_per_doubling_around"]
    curve = _curve(capacity, row.get("context", ""))
    i = curve.index(row)
    short = [r["budget"] for r in curve[max(i - 1, 0):i + 2] if not r["plateau"]]  # the slope's points
    note = f" (not at a plateau: {', '.join(short)})" if short else ""
    return (f"capacity curve at budget {where} ({_num(row['params_per_rank'])} parameters per rank): "
            f"{_fmt(slope, '+.2f')} dB per doubling of parameters (target >= {CAPACITY_TARGET_DB} dB at a "
            f"plateau): {_met(slope is not None and slope >= CAPACITY_TARGET_DB and not short)}{note}")


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _fmt(v, spec):
    return "–" if v is None else format(v, spec)


def _num(v):
    return "–" if v is None else f"{v / 1e6:.3g} M"
