"""What a collapsed model is: an empty occupancy grid (the runs it stops are in
tests/e2e/test_collapse.py)."""
from __future__ import annotations

import torch

from distnerf.model import build_model


def test_a_healthy_grid_is_not_collapsed_and_an_empty_one_is():
    m = build_model({"name": "grid", "resolutions": [8], "upsample_steps": []}, torch.tensor(
        [[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]]), torch.zeros(3))
    assert m.collapsed() == []
    m.occupancy.binary.zero_()
    assert m.collapsed() == ["occupancy grid"]
