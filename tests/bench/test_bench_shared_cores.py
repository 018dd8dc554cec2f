"""bench/reliability/shared_cores.py: the phases interleave the variants and rotate the competitors, each repeat
gives its own ratio, the headline is their median with min and max (never the best), and the page's table reads
that result. Made-up rays/s (test data only); no trainer runs."""
from __future__ import annotations

import json

import pytest

from bench.reliability import shared_cores as sc
from bench.reliability import tables
from bench.tablekit import Results


def test_phase_plan_interleaves_variants_and_rotates_the_competitors():
    plan = sc.phase_plan(["default", "planned"], 3)
    assert len(plan) == 2 * 3 * 3
    visits = [(r, v) for r, v, _ in plan[::3]]
    assert visits == [(0, "default"), (0, "planned"), (1, "default"), (1, "planned"), (2, "default"), (2, "planned")]
    orders = [[c for r, v, c in plan if (r, v) == (rep, "planned")] for rep in range(3)]
    assert orders == [["alone", "nice", "plain"], ["nice", "plain", "alone"], ["plain", "alone", "nice"]]
    for position in range(3):  # each competitor at each position once in three repeats
        assert sorted(o[position] for o in orders) == ["alone", "nice", "plain"]


def test_median_spread():
    assert sc.median_spread([1.82, 1.16, 1.44]) == {"median": 1.44, "min": 1.16, "max": 1.82, "n": 3}
    assert sc.median_spread([2.0, 1.0, 4.0, 3.0]) == {"median": 2.5, "min": 1.0, "max": 4.0, "n": 4}
    with pytest.raises(ValueError):
        sc.median_spread([])


# one variant's made-up rays/s per repeat: (alone, beside nice'd, beside un-niced)
RATES = {"planned": [(30000, 25000, 20000), (30000, 20000, 10000), (30000, 24000, 24000)],
         "default": [(28000, 28000, 14000), (28000, 28000, 7000), (28000, 28000, 9333)]}


class FakeChild:
    """Answers ``measure`` as :class:`bench.reliability.shared_cores.Child` does, from :data:`RATES`."""

    def __init__(self, variant: str, log: list):
        self.variant, self.log, self.step = variant, log, 700

    def measure(self, seconds: float) -> dict:
        self.log.append(self.variant)
        r, name = self.next_phase
        rate = dict(zip(sc.COMPETITORS, RATES[self.variant][r]))[name]
        steps = round(rate * seconds / 4096)
        got = {"step_before": self.step, "steps": steps, "seconds": steps * 4096 / rate, "rays_per_s": rate,
               "cpu_s": 0.2 * steps}
        self.step += steps
        return got


def _measured(variants=("default", "planned"), repeats=3):
    plan = sc.phase_plan(list(variants), repeats)
    log: list = []
    children = {v: FakeChild(v, log) for v in variants}
    phases = iter(plan)

    def competitor(name):  # no process: note which repeat and competitor the next measure answers
        r, v, c = next(phases)
        assert c == name
        children[v].next_phase = (r, c)
        return None

    rows = sc.measure(plan, children, 8.0, competitor=competitor)
    return plan, log, rows


def test_measure_runs_the_plan_in_order_and_records_every_phase():
    plan, log, rows = _measured()
    assert log == [v for _, v, _ in plan]
    assert [(r["repeat"], r["variant"], r["competitor"]) for r in rows] == plan
    assert [r["position"] for r in rows] == [0, 1, 2] * 6
    planned = [r for r in rows if r["variant"] == "planned"]
    assert all(a["step_before"] + a["steps"] == b["step_before"] for a, b in zip(planned, planned[1:]))
    assert all(len(r["load_before"]) == 3 for r in rows)


def test_summary_takes_the_median_of_the_repeats_not_the_best():
    _, _, rows = _measured()
    reps = sc.repeat_ratios(rows)
    assert [(r["variant"], r["repeat"], r["slowdown_plain"]) for r in reps if r["variant"] == "planned"] == [
        ("planned", 0, 1.5), ("planned", 1, 3.0), ("planned", 2, 1.25)]
    ready = {"default": {"torch_threads": 2}, "planned": {"torch_threads": 2}}
    summary = {s["variant"]: s for s in sc.summarise(rows, ready)}
    assert summary["planned"]["slowdown_plain"] == {"median": 1.5, "min": 1.25, "max": 3.0, "n": 3}
    assert summary["planned"]["slowdown_nice"] == {"median": 1.25, "min": 1.2, "max": 1.5, "n": 3}
    assert summary["planned"]["rays_per_s_plain"] == 20000 and summary["planned"]["cpu_s_per_step"] == 0.2
    assert summary["default"]["slowdown_plain"]["median"] == 3.0
    top = sc.headline(list(summary.values()))
    assert (top["variant"], top["median"], top["min"], top["max"]) == ("planned", 1.5, 1.25, 3.0)
    assert sc.headline([summary["default"]])["variant"] == "default"  # planned not measured: the first variant


def test_table_reads_the_repeated_result(tmp_path):
    _, _, rows = _measured()
    ready = {v: {"torch_threads": 2, "omp_wait": w, "resumed_step": 700, "resolution": 160}
             for v, w in (("default", "OMP_WAIT_POLICY (unset)"), ("planned", "GOMP_SPINCOUNT=30000"))}
    summary = sc.summarise(rows, ready)
    warm = {"steps": 700, "seconds": 95.0, "resolution": 160, "final_stage_step": 600,
            "windows": [{"step": 600 + 50 * i, "rays_per_s": 30000 + i} for i in range(3)]}
    meta = {"cpu_count": 2, "uptime_before": "up", "uptime_after": "up", "command": "python -m x",
            "git_commit": "abc1234", "git_dirty": False}
    body = {"headline": sc.headline(summary), "summary": summary, "repeats": sc.repeat_ratios(rows), "rows": rows,
            "warmup": warm, "children": ready, "meta": meta,
            "settings": {"variants": ["default", "planned"], "repeats": 3, "seconds": 8.0, "settle_steps": 30}}
    path = tmp_path / "reliability" / "results" / "shared_cores" / "shared_cores.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(body))
    text = "\n".join(tables.shared_cores(Results(tmp_path)))
    assert ("| planned | 2 | GOMP_SPINCOUNT=30000 | 30000 | 24000 | 20000 | 1.25x (1.20-1.50) | 1.50x (1.25-3.00) |"
            in text)
    assert "`planned` **1.50x** slower beside the un-niced competitor (median of 3 repeats; 1.25-3.00)" in text
    assert "one warm-up of 700 steps" in text and "not past the final stage" not in text
    warm["steps"] = 500
    path.write_text(json.dumps(body))
    assert "not past the final stage" in "\n".join(tables.shared_cores(Results(tmp_path)))
