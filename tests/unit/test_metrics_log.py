"""The one reader of ``RUN/metrics.jsonl`` (observe/logger.py), against the writer's own rows."""
from __future__ import annotations

import json

import pytest

from distnerf.observe.logger import METRICS_LOG, JsonlLogger, final_model_size, read_metrics_log


def test_reads_what_the_logger_wrote_and_follows_a_live_run(tmp_path):
    logger = JsonlLogger(tmp_path / METRICS_LOG)
    rows = [{"step": s, "loss": 1.0 / (s + 1), "rays_per_s": 100.0 * s} for s in range(50)]
    for r in rows:
        logger.log(r)
    logger.close()
    assert read_metrics_log(tmp_path) == rows
    assert read_metrics_log(tmp_path / "absent") == []
    # a poller's tail: only whole lines, the newest last
    tail = read_metrics_log(tmp_path, tail_bytes=200)
    assert 0 < len(tail) < len(rows) and tail == rows[-len(tail):]
    # a row being written: left out when following, refused otherwise (naming file and line)
    with open(tmp_path / METRICS_LOG, "a") as f:
        f.write(json.dumps({"step": 50})[:7])
    assert read_metrics_log(tmp_path, partial_tail=True) == rows
    with pytest.raises(ValueError, match=r"metrics\.jsonl: line 51 is not JSON"):
        read_metrics_log(tmp_path)


def _size_event(step: int, params: list[int], rss: list[float]) -> dict:
    """A ``model_size`` row as the trainer writes it: the largest rank's figures and each rank's."""
    return {"step": step, "event": "model_size", "parameters_per_rank": max(params),
            "parameters_total": sum(params), "peak_rss_mb": max(rss),
            "ranks": [{"parameters": p, "peak_rss_mb": m} for p, m in zip(params, rss)]}


def test_a_resumed_runs_model_size_is_the_finished_models_with_the_peak_over_its_sessions(tmp_path):
    # session 1: stopped by a signal at step 294, before the grid's last upsampling (53 k per rank)
    first = JsonlLogger(tmp_path / METRICS_LOG)
    for s in range(0, 295, 50):
        first.log({"step": s, "loss": 0.1})
    first.log(_size_event(294, [53248, 53000], [910.0, 700.0]))
    first.close()
    # session 2: resumed from 294 in a fresh process (lower peak for rank 0, higher for rank 1), finished at 180 k
    second = JsonlLogger(tmp_path / METRICS_LOG, resume_step=294)
    second.log({"step": 400, "loss": 0.05})
    second.log(_size_event(400, [179712, 179000], [650.0, 720.0]))
    second.close()
    size = final_model_size(read_metrics_log(tmp_path))
    assert size["parameters_per_rank"] == 179712 and size["parameters_total"] == 358712 and size["step"] == 400
    assert size["peak_rss_mb"] == 910.0  # session 1's rank 0, the run's true peak
    assert [r["peak_rss_mb"] for r in size["ranks"]] == [910.0, 720.0]
    assert [r["parameters"] for r in size["ranks"]] == [179712, 179000]


def test_model_size_per_rank_peaks_across_an_elastic_resume_and_a_run_without_one(tmp_path):
    rows = [_size_event(100, [60000, 60000], [800.0, 820.0]), {"step": 150, "loss": 0.2},
            _size_event(200, [40000, 40000, 40000], [500.0, 510.0, 520.0])]  # resumed at 3 ranks
    size = final_model_size(rows)
    assert size["peak_rss_mb"] == 820.0
    # the ranks are not the same processes across world sizes: each rank's figure is its last session's
    assert [r["peak_rss_mb"] for r in size["ranks"]] == [500.0, 510.0, 520.0]
    assert final_model_size([{"step": 1, "loss": 0.3}]) is None
