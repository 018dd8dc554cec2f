"""Joint ``ss`` sub-models are regularised as one scene: the total variation of K sub-models
holding a linear density equals the analytic value of one model on the same voxels."""
from __future__ import annotations

import pytest
import torch

from distnerf.components.regularizer import add_regularizer_grads_
from distnerf.distributed import DistEnv
from distnerf.strategy.partition import grid_partition
from distnerf.strategy.regions import RegionModels
from distnerf.strategy.ss import SSStrategy

BOUNDS = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])
SLOPE = torch.tensor([0.7, -1.2, 0.4])  # d(x) = SLOPE . x: every neighbour difference along axis a is SLOPE[a] h_a


def _tv_of_sub_models(training: str, num_regions: int, weight: float) -> tuple[float, list]:
    strategy = SSStrategy({"training": training, "context_resolution": 4}, DistEnv(rank=0, world_size=1))
    strategy.partition = grid_partition(BOUNDS, num_regions)
    cfg = {"name": "grid", "resolutions": [9], "upsample_steps": [], "tv_weight": weight, "cubic_voxels": True,
           "tighten_aabb": False}
    models, edges = {}, []
    for k in range(num_regions):
        model = strategy.build_region_model(cfg, BOUNDS, torch.ones(3), k)
        density, _, shape, box = model._tables()[0]
        axes = [torch.linspace(float(box[0, a]), float(box[1, a]), shape[a]) for a in range(3)]
        vertices = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3)
        with torch.no_grad():
            density.copy_((vertices @ SLOPE)[:, None])
            for table in model.bounded_parameters()[2:]:  # an independent model's context tables: flat
                table.zero_()
        models[k] = model
        edges.append(((box[1] - box[0]) / (torch.tensor(shape) - 1)).tolist())
    # a rank holding every region: its container lists every sub-model's tables, each at its own weight
    total = float(add_regularizer_grads_(RegionModels(models, strategy.partition), value=True))
    return total, edges


@pytest.mark.parametrize("num_regions", [2, 4])
def test_joint_sub_models_sum_to_one_models_total_variation(num_regions):
    weight = 1e-3
    total, edges = _tv_of_sub_models("joint", num_regions, weight)
    h = torch.tensor(edges[0], dtype=torch.float64)
    assert all(torch.allclose(torch.tensor(e, dtype=torch.float64), h, rtol=1e-6) for e in edges)
    # one model on voxels of edge h: mean over each axis's pairs of (SLOPE_a h_a)^2, times the weight
    one_model = weight * float(((SLOPE.double() * h) ** 2).sum())
    assert total == pytest.approx(one_model, rel=1e-4)


def test_independent_sub_models_keep_the_weight():
    """Each independent sub-model is a model of the whole scene: its own focus tables hold the
    linear field at the full weight (its context tables are flat here)."""
    weight = 1e-3
    total, edges = _tv_of_sub_models("independent", 2, weight)
    per_model = [weight * float(((SLOPE.double() * torch.tensor(e, dtype=torch.float64)) ** 2).sum()) for e in edges]
    assert total == pytest.approx(sum(per_model), rel=1e-4)
