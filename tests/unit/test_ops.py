"""distnerf.observe.ops counts what it says it counts, and a grid training step's dispatched operators
stay under their ceiling (the host cost of a GPU step: issue 49)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from distnerf.host_buffers import sync_free_paths
from distnerf.observe.ops import OpCounter
from tests.trainers import build_trainer, run_step

ROOT = Path(__file__).resolve().parents[2]

#: operators per eager training step of the grid model (lego's options on the smoke scene, the CUDA paths; ATen
#: operators, views excluded): 426 on 2026-12-06 at e1483d9 (issue 49's count), 248 after that day's fusions, 244 after the static
#: step's (|d| once, aminmax, one loss-weight operator, a host batch's known valid count), 243 with the step
#: agreement read after the backward
#: (bench/throughput/README.md, "Operators per training step"); issue 49's target <= 250. Lowered as the step is
#: fused, never raised
GRID_STEP_CEILING = 243


def test_counts_each_kernel_once_and_no_views():
    x = torch.arange(12.0)
    with OpCounter() as ops:
        y = x.view(3, 4).t().reshape(-1)[2:]     # views only: view, t, (reshape of a non-contiguous: a copy), slice
        z = (x * 2 + 1).sum()                    # mul, add, sum
        x.add_(1.0)                              # in place: its own key
    counts = ops.by_op()
    assert counts.pop("aten.mul.Tensor") == 1 and counts.pop("aten.add.Tensor") == 1
    assert counts.pop("aten.sum.default") == 1 and counts.pop("aten.add_.Tensor") == 1
    # reshape of the transposed view cannot be a view: one copy (a clone; its _unsafe_view is metadata only)
    assert counts == {"aten.clone.default": 1}, counts
    assert ops.total == 5 and y.shape == (10,) and float(z) == 2 * (11 * 12 // 2) + 12
    assert not any(k.startswith("aten.view") or k.startswith("aten.t.") or k.startswith("aten.slice")
                   for k in ops.by_op())


def test_backward_and_sections_are_counted():
    w = torch.rand(5, requires_grad=True)
    with OpCounter(locations=True) as ops:
        with ops.section("forward"):
            loss = (w * w).sum()
        with ops.section("backward"):
            loss.backward()
    sections = ops.by_section()
    assert sections["forward"] == 2  # mul, sum
    assert sections["backward"] >= 2  # at least the expand of the sum's grad (a view: not counted) and mul's grads
    assert ops.total == sum(sections.values())
    here = [k for k in ops.summary()["by_location"] if k.startswith("tests/")]
    assert not here  # locations are frames inside the distnerf package; this file is outside it
    assert ops.summary()["by_location"] == {"outside distnerf": ops.total}


@pytest.mark.parametrize("rays", [64])
def test_grid_training_step_operators_under_ceiling(tmp_path, rays):
    """Past the smoke grid's upsampling (step 10), with the paths a CUDA run takes (sync_free_paths);
    the count does not depend on the batch (checked at 64 and 512 rays by bench/...ops runner)."""
    from distnerf import distributed as D

    torch.manual_seed(0)
    with sync_free_paths(True):
        trainer, env = build_trainer(["model=grid", f"train.global_rays={rays}"], tmp_path / "run")
        try:
            while trainer.step < 17:
                run_step(trainer)
            with OpCounter(locations=True) as ops:
                run_step(trainer)
        finally:
            trainer.close()
            D.shutdown(env)
    assert ops.total <= GRID_STEP_CEILING, ops.summary()["by_op"]
    # the step does real work: a forward, a backward and an optimizer update all ran under the counter
    assert ops.by_op().get("aten.index_select.default", 0) > 0 and ops.total > 50
