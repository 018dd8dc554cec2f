"""The one reader of ``RUN/metrics.jsonl`` (observe/logger.py), against the writer's own rows."""
from __future__ import annotations

import json

import pytest

from distnerf.observe.logger import METRICS_LOG, JsonlLogger, read_metrics_log


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
