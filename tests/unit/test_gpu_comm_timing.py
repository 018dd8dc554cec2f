"""The CUDA path's communication figures from the DDP hook's events (issue: NCCL untimed).
No GPU here: the events are stood in by their times on one timeline (what ``elapsed_time``
gives after the step's synchronisation); expected values by hand."""
from __future__ import annotations

import pytest

from distnerf.observe.breakdown import exposed_after_last_launch, gpu_comm_figures


def test_communication_after_the_last_launch_is_exposed():
    # three buckets: launched at 0, 0.5, 1.5 (backward's computation ends at 1.5), done at 1, 2, 3
    exposed, total = exposed_after_last_launch([(0.0, 1.0), (0.5, 2.0), (1.5, 3.0)])
    assert total == pytest.approx(3.0)
    assert exposed == pytest.approx(1.5)  # [1.5, 3]
    # every bucket done before the last launch except the last one, which takes 0.2
    exposed, total = exposed_after_last_launch([(0.0, 0.4), (1.0, 1.3), (2.0, 2.2)])
    assert exposed == pytest.approx(0.2) and total == pytest.approx(0.9)
    assert exposed_after_last_launch([]) == (0.0, 0.0)


def test_bucket_events_resolve_against_the_step_start():
    comm = {"events": [(10.5, 11.0, 100), (11.2, 12.0, 300)], "spans": [], "bytes": 400}
    fig = gpu_comm_figures(comm, 10.0, lambda a, b: b - a)
    assert fig["spans"] == [pytest.approx((0.5, 1.0)), pytest.approx((1.2, 2.0))]
    assert fig["bucket_s"] == [pytest.approx(0.5), pytest.approx(0.8)]
    assert fig["exposed_s"] == pytest.approx(0.8) and fig["total_s"] == pytest.approx(1.3)
    assert gpu_comm_figures({"events": []}, 0.0, lambda a, b: b - a) is None
    assert gpu_comm_figures(None, 0.0, lambda a, b: b - a) is None
