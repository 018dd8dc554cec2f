"""The capacity study's statistics (distnerf.study.capacity) against hand-computed values, and a
study's per-world-size levels (distnerf.study.plan)."""
from __future__ import annotations

import math

import pytest
from omegaconf import OmegaConf

from distnerf.config_check import section
from distnerf.schema import StudyConfig
from distnerf.study import capacity, plan


def test_the_plateau_detector_on_synthetic_curves():
    # a saturating curve 30 (1 - exp(-s / 200)) validated every 100 steps up to 1000: the last 20 %
    # (800 -> 1000) gains 30 (exp(-4) - exp(-5)) = 0.3474 dB
    sat = [(s, 30 * (1 - math.exp(-s / 200))) for s in range(100, 1001, 100)]
    assert capacity.plateau_gain(sat) == pytest.approx(30 * (math.exp(-4) - math.exp(-5)), abs=1e-12)
    # slower: steps to 3000 -> 30 (exp(-12) - exp(-15)) ~ 1.7e-4 dB: a plateau
    late = [(s, 30 * (1 - math.exp(-s / 200))) for s in range(300, 3001, 300)]
    assert capacity.plateau_gain(late) < capacity.PLATEAU_GAIN_DB
    # a straight line 20 + s / 100 validated at 0, 300, 700 and 1000: (1 - 0.2) N = 800 lies between 700
    # and 1000, interpolated: 20 + 8 = 28; the gain is 30 - 28 = 2 (any order of the points)
    line = [(1000, 30.0), (0, 20.0), (700, 27.0), (300, 23.0)]
    assert capacity.plateau_gain(line) == pytest.approx(2.0)
    assert capacity.plateau_gain([(900, 1.0), (1000, 2.0)]) is None  # nothing at or before step 800
    assert capacity.plateau_gain([]) is None
    # validation noise at a plateau: five points every 50 steps over the window 800-1000, 30 dB plus
    # (0, +0.1, -0.1, -0.1, +0.25). The two single validations differ by 0.25 dB; the least-squares
    # line (x centred: -2..2 in units of 50 steps) has slope (0 - 0.1 + 0 - 0.1 + 0.5) / 10 = 0.03 per
    # 50 steps, a rise of 0.03 x 4 = 0.12 dB over the window: a plateau by the fitted line only
    noisy = [(s, 30.0) for s in range(0, 800, 100)] + [
        (800, 30.0), (850, 30.1), (900, 29.9), (950, 29.9), (1000, 30.25)]
    assert capacity.plateau_gain(noisy) == pytest.approx(0.12)
    assert noisy[-1][1] - noisy[-5][1] == pytest.approx(0.25) and 0.25 > capacity.PLATEAU_GAIN_DB
    # a rise under the same noise is still seen: + 0.2 dB per 50 steps on top gives 0.12 + 0.8
    rising = [(s, y + 0.004 * (s - 800)) if s >= 800 else (s, y) for s, y in noisy]
    assert capacity.plateau_gain(rising) == pytest.approx(0.92)


def test_mean_sd_and_gain_per_doubling_by_hand():
    mean, sd, n = capacity.mean_sd([24.0, 25.0, None, 27.0])
    assert (n, mean) == (3, pytest.approx(76 / 3))
    assert sd == pytest.approx(math.sqrt(((24 - 76 / 3) ** 2 + (25 - 76 / 3) ** 2 + (27 - 76 / 3) ** 2) / 2))
    assert capacity.mean_sd([25.0])[1] is None and capacity.mean_sd([]) == (None, None, 0)
    assert capacity.per_doubling(1e6, 24.0, 4e6, 27.0) == pytest.approx(1.5)  # 3 dB over two doublings
    assert capacity.per_doubling(2, 20.0, 2, 21.0) is None


def summary(key, strategy, w, budget, psnrs, params, gains=(0.05, 0.1, 0.1), constant=11.0, steps=1000):
    return {"key": key, "n": len(psnrs), "values": {"strategy": strategy, "world_size": w, "budget": budget},
            "psnrs": list(psnrs), "parameters_per_rank": params, "plateau_gains": list(gains),
            "constant_psnr": constant, "steps": steps}


def test_capacity_and_ranks_tables_with_the_targets():
    # parameters 1 M, 2.5 M, 4 M: 1.3219 and 0.6781 doublings between neighbours (log2 2.5, log2 1.6), so
    # a slope that forgot the logarithm or used the ratio shows. Expected values worked out by hand:
    # means 22.2, 24.1, 25.1 dB; slopes 1.9 / 1.3219281 = 1.4372945 and 1.0 / 0.6780719 = 1.4747698 dB per
    # doubling; around p2 their mean 1.4560322
    keys = {s["key"]: s for s in [
        summary("ddp-w1-p1", "ddp", 1, "p1", [22.0, 22.2, 22.4], 1e6),
        summary("ddp-w1-p2", "ddp", 1, "p2", [24.0, 24.0, 24.3], 2.5e6),
        summary("ddp-w1-p4", "ddp", 1, "p4", [25.0, 25.2, 25.1], 4e6, gains=(0.1, 0.3, None)),
        summary("ddp-w2-p2", "ddp", 2, "p2", [24.1, 24.2, 24.3], 2e6),
        summary("ss_joint-w2-p2", "ss_joint", 2, "p2", [25.5, 25.0, 25.6], 2e6),
        summary("ss_joint-w4-p2", "ss_joint", 4, "p2", [26.0, 26.1, 26.2], 2e6),
    ]}
    keys["ss_joint-w4-p2"].update(regions_crossed_mean=1.75, training="joint", step_s_median=0.0425)
    keys["ddp-w2-p2"]["step_s_median"] = 0.02
    cap = capacity.capacity_rows(keys)
    assert [r["budget"] for r in cap] == ["p1", "p2", "p4"]
    assert [r["params_per_rank"] for r in cap] == [1e6, 2.5e6, 4e6]
    assert cap[1]["psnr_mean"] == pytest.approx(24.1) and cap[1]["n"] == 3
    assert cap[1]["psnr_sd"] == pytest.approx(0.17320508)  # sqrt((0.01 + 0.01 + 0.04) / 2)
    assert cap[1]["db_per_doubling"] == pytest.approx(1.4372945, abs=1e-6)
    assert cap[2]["db_per_doubling"] == pytest.approx(1.4747698, abs=1e-6)
    assert cap[1]["db_per_doubling_around"] == pytest.approx(1.4560322, abs=1e-6)
    assert cap[0]["db_per_doubling"] is None and cap[0]["db_per_doubling_around"] == pytest.approx(1.4372945, abs=1e-6)
    assert cap[0]["plateau"] and not cap[2]["plateau"] and cap[2]["gain_last_max"] == pytest.approx(0.3)
    ranks = capacity.ranks_rows(keys)
    joint = [r for r in ranks if r["strategy"] == "ss_joint"]
    assert [r["world_size"] for r in joint] == [1, 2, 4]
    # ss joint means 24.1 (W 1: the ddp cell), 25.3666667, 26.1; one doubling of ranks each step
    assert joint[0]["source"].startswith("ddp-w1-p2") and joint[0]["psnr_mean"] == pytest.approx(24.1)
    assert joint[1]["psnr_mean"] == pytest.approx(25.3666667)
    assert joint[1]["db_per_doubling"] == pytest.approx(1.2666667)  # W 1 -> 2
    assert joint[2]["db_per_doubling"] == pytest.approx(0.7333333)  # W 2 -> 4
    assert joint[2]["delta_vs_w1"] == pytest.approx(2.0)
    ddp = [r for r in ranks if r["strategy"] == "ddp"]
    assert [r["world_size"] for r in ddp] == [1, 2] and ddp[1]["delta_vs_w1"] == pytest.approx(0.1)
    # a joint rank marches the segments of every region a ray crosses; ddp and the W = 1 stand-in one per ray
    assert [r["segments_per_ray"] for r in joint] == [1.0, None, 1.75] and ddp[1]["segments_per_ray"] == 1.0
    assert joint[2]["step_ms"] == pytest.approx(42.5) and ddp[1]["step_ms"] == pytest.approx(20.0)
    assert joint[1]["step_ms"] is None  # no step time in the summary: none invented
    lines = capacity.verdicts(cap, ranks)
    # 1.45 < 1.5, and p4 (a neighbour: one of the slope's points) gained 0.3 dB over its last 20%
    assert lines[0].startswith("capacity curve at budget p2") and "+1.46 dB" in lines[0]
    assert lines[0].endswith("MISSED (not at a plateau: p4)")
    assert any("W 1 -> 2" in ln and ln.endswith(": met") for ln in lines)  # +1.27 dB
    assert any("W 2 -> 4" in ln and ln.endswith("MISSED") for ln in lines)  # +0.73 dB
    assert any(ln.startswith("ddp at p2, W = 2: +0.10") and ln.endswith(": met") for ln in lines)


def test_a_flat_curve_under_a_decayed_learning_rate_is_no_plateau():
    # lr 1e-3 * 0.1 ** (step / 1500) logged every 500 steps to 3000: at step 2400 (the window's start)
    # the nearest logged step is 2500, 0.1 ** (2500 / 1500) = 0.0215 of the start
    lrs = [(s, 1e-3 * 0.1 ** (s / 1500)) for s in range(0, 3001, 500)]
    assert capacity.lr_share(lrs) == pytest.approx(0.1 ** (2500 / 1500))
    assert capacity.lr_share([(s, 1e-3) for s in range(0, 3001, 500)]) == pytest.approx(1.0)
    assert capacity.lr_share([(0, 1e-3)]) is None and capacity.lr_share([(0, None), (10, None)]) is None
    # the same three budgets, 2 dB per doubling, every repeat flat over its last 20%: met with a live
    # learning rate, missed (naming every budget) when it had decayed to 2% there
    def keys(share):
        out = {}
        for i, (b, y) in enumerate([("p1", 22.0), ("p2", 24.0), ("p4", 26.0)]):
            s = summary(f"ddp-w1-{b}", "ddp", 1, b, [y, y, y], 1e6 * 2 ** i)
            s["plateau_lr_shares"] = [share] * 3
            out[s["key"]] = s
        out["ss_joint-w2-p2"] = summary("ss_joint-w2-p2", "ss_joint", 2, "p2", [25.0] * 3, 2e6)
        return out
    for share, verdict in ((0.5, ": met"), (0.02, "MISSED (not at a plateau: p1, p2, p4)")):
        cap = capacity.capacity_rows(keys(share))
        assert [r["plateau"] for r in cap] == [share >= capacity.PLATEAU_MIN_LR_SHARE] * 3
        assert cap[1]["lr_share_min"] == pytest.approx(share)
        line = capacity.verdicts(cap, capacity.ranks_rows(keys(share)))[0]
        assert line.startswith("capacity curve at budget p2") and "+2.00 dB" in line and line.endswith(verdict)


def test_a_curve_without_ranks_is_judged_at_every_inner_budget():
    # conf/study/capacity_plateau.yaml: one-rank ddp cells only. Slopes by hand: p1 -> p2 +2.0, p2 -> p4
    # +1.0, p4 -> p8 +1.6 dB per doubling; around p2 (2.0 + 1.0) / 2 = 1.5 (met: >= 1.5), around p4
    # (1.0 + 1.6) / 2 = 1.3 (missed); the ends have one side and get no verdict
    keys = {s["key"]: s for s in [
        summary("ddp-w1-p1", "ddp", 1, "p1", [22.0] * 3, 1e6),
        summary("ddp-w1-p2", "ddp", 1, "p2", [24.0] * 3, 2e6),
        summary("ddp-w1-p4", "ddp", 1, "p4", [25.0] * 3, 4e6),
        summary("ddp-w1-p8", "ddp", 1, "p8", [26.6] * 3, 8e6),
    ]}
    cap = capacity.capacity_rows(keys)
    lines = capacity.verdicts(cap, capacity.ranks_rows(keys))
    assert capacity.ranks_rows(keys) == [] and len(lines) == 2
    assert lines[0].startswith("capacity curve at budget p2") and "+1.50 dB" in lines[0] and lines[0].endswith(": met")
    assert lines[1].startswith("capacity curve at budget p4") and "+1.30 dB" in lines[1] and lines[1].endswith("MISSED")


def test_a_world_size_level_adds_its_overrides_and_is_declared():
    cfg = section(StudyConfig, OmegaConf.create({
        "name": "t", "axes": {"strategy": ["ddp"], "world_size": [1, 2]},
        "levels": {"world_size": {2: ["train.global_rays=4096"]}}}))
    cells = {c.key: c for c in plan.expand(cfg)}
    assert "train.global_rays=4096" in cells["ddp-w2"].overrides
    assert not any(o.startswith("train.global_rays") for o in cells["ddp-w1"].overrides)
    assert "train.global_rays" in plan.declared_keys(cfg)


def test_the_regions_a_ray_crosses_and_their_extrapolation_by_hand():
    import torch

    from distnerf.strategy.ss import regions_crossed
    from distnerf.study import scaling

    crossing = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 0], [1, 1, 1], [0, 1, 0]], dtype=torch.bool)
    got = regions_crossed(crossing)  # 4 rays cross something: counts 1, 2, 3, 1
    assert got["regions_crossed_mean"] == pytest.approx(7 / 4)
    assert got["regions_crossed_share"] == {"1": 0.5, "2": 0.25, "3": 0.25}
    assert regions_crossed(torch.zeros(2, 2, dtype=torch.bool))["regions_crossed_mean"] is None
    m = scaling.Measured(compute_s_per_ray=1e-6, global_rays=1, regions_crossed=1.5, measured_regions=2)
    assert scaling.crossed_regions(m, 2) == pytest.approx(1.5)
    assert scaling.crossed_regions(m, 512) == pytest.approx(1 + 0.5 * 16)  # sqrt(512 / 2) = 16
    assert scaling.crossed_regions(scaling.Measured(1e-6, 1), 512) == 512  # not measured: every region
    m.fusion_s_per_ray_region, m.render_rays, m.render_s_per_ray = 1e-7, 100, 1e-5
    pred = scaling.predict(m, 512, 1e9, 0.0)
    assert pred["fused_render_s"] == pytest.approx(1e-5 * 100 / 512 + 1e-7 * 100 * 9)  # no exchange bytes


def test_each_ranks_row_is_set_beside_the_single_model_of_equal_total_parameters():
    curve = [{"params_per_rank": 1.0e6, "psnr_mean": 25.0, "psnr_sd": 0.1},
             {"params_per_rank": 2.05e6, "psnr_mean": 26.0, "psnr_sd": 0.2}]
    ranks = [{"world_size": 1, "params_per_rank": 1e6, "psnr_mean": 25.0},
             {"world_size": 2, "params_per_rank": 1e6, "psnr_mean": 27.5},
             {"world_size": 4, "params_per_rank": 1e6, "psnr_mean": 28.0}]
    capacity.annotate_equal_total(ranks, curve)
    assert ranks[1]["single_equal_total_psnr"] == 26.0 and ranks[1]["vs_single_equal_total"] == pytest.approx(1.5)
    assert (ranks[1]["single_equal_total_params"], ranks[1]["single_equal_total_sd"]) == (2.05e6, 0.2)
    assert ranks[0]["single_equal_total_params"] == 1.0e6 and ranks[2]["single_equal_total_sd"] is None
    assert ranks[0]["vs_single_equal_total"] == 0.0
    assert ranks[2]["single_equal_total_psnr"] is None  # no 4 M cell on the curve
    # a curve cell trained for more steps (to reach its plateau) is no equal-steps reference
    long = [curve[0], {**curve[1], "steps": 6000}]
    rows = [{"world_size": 2, "params_per_rank": 1e6, "psnr_mean": 27.5, "steps": 3000}]
    capacity.annotate_equal_total(rows, long)
    assert rows[0]["single_equal_total_psnr"] is None
    capacity.annotate_equal_total(rows, [curve[0], {**curve[1], "steps": 3000}])
    assert rows[0]["single_equal_total_psnr"] == 26.0


def test_a_curve_alone_prints_its_targets_under_the_curve_and_no_ranks_section():
    from distnerf.study.document import section_tables

    keys = {s["key"]: s for s in [summary(f"ddp-w1-{b}", "ddp", 1, b, [y] * 3, p)
                                  for b, y, p in (("p1", 22.0, 1e6), ("p2", 24.0, 2e6), ("p4", 26.0, 4e6))]}
    cap = capacity.capacity_rows(keys)
    tables = {"breakdown": [], "sync": [], "inference": [], "input": [], "quality": [], "capacity": cap,
              "ranks": [], "verdicts": capacity.verdicts(cap, []), "scaling": None, "scaling_check": None, "differs": []}
    sections = dict(section_tables({"tables": tables, "cells": [], "declared": []}))
    assert not any(title.startswith("Quality against ranks") for title in sections)
    body = sections["Capacity: test PSNR against parameters per rank (ddp, W = 1)"]
    assert body[-2] == "Targets:" and body[-1].startswith("- capacity curve at budget p2") and body[-1].endswith(": met")
