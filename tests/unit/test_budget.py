"""``model.max_params``: grid and ngp sized to a parameter budget, counted independently."""
from __future__ import annotations

import pytest
import torch

from distnerf.model import build_model
from distnerf.model.budget import scaled_resolutions
from distnerf.config_check import ConfigError

BOX = torch.tensor([[-1.0, -1.0, -0.5], [1.0, 1.0, 0.5]])


def count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def final_stage(cfg: dict, model, device: str = "cpu", **extra) -> int:
    """Parameters of the model at its final resolution, built without a budget (``meta``: no memory)."""
    last = model.budget["resolutions"][-1]
    with torch.device(device):
        return count(build_model({**cfg, "max_params": None, "resolutions": [last], "upsample_steps": []}, BOX,
                                 torch.ones(3), **extra))


@pytest.mark.parametrize("color", ["sh", "mlp"])
def test_grid_final_stage_fits_budget_within_one_cube_step(color):
    cfg = {"name": "grid", "color": color, "max_params": 2_000_000}
    model = build_model(cfg, BOX, torch.ones(3))
    n, got = model.budget["resolutions"][-1], final_stage(cfg, model)
    assert got == model.budget["final_parameters"] <= 2_000_000
    with torch.device("meta"):  # one more vertex per axis would not fit
        bigger = count(build_model({**cfg, "max_params": None, "resolutions": [n + 1], "upsample_steps": []}, BOX,
                                   torch.ones(3)))
    assert bigger > 2_000_000
    assert model.budget["resolutions"] == scaled_resolutions([64, 128, 160], n)


def test_grid_within_one_percent_of_large_budget():
    cfg = {"name": "grid", "max_params": 400_000_000}
    with torch.device("meta"):
        model = build_model(cfg, BOX, torch.ones(3))
    got = final_stage(cfg, model, "meta")
    assert 0.99 * 400_000_000 <= got <= 400_000_000


def test_grid_sub_model_budget_counts_context_tables():
    cfg = {"name": "grid", "max_params": 500_000}
    extra = {"focus_aabb": [[-1.0, -1.0, -0.5], [0.0, 1.0, 0.5]], "context_resolution": 16}
    model = build_model(cfg, BOX, torch.ones(3), **extra)
    got = final_stage(cfg, model, **extra)
    assert got == model.budget["final_parameters"] <= 500_000
    assert model.context_density.numel() == 16 ** 3


@pytest.mark.parametrize("budget", [300_000, 3_000_000])
def test_ngp_table_within_one_percent(budget):
    model = build_model({"name": "ngp", "max_params": budget}, BOX, torch.ones(3))
    assert 0.99 * budget <= count(model) == model.budget["final_parameters"] <= budget
    assert model.budget["table_size"] & (model.budget["table_size"] - 1)  # not a power of two: any T
    out = model.field_density(torch.rand(64, 3) - 0.5)  # the hash indexes the odd-sized table
    assert out.shape == (64,) and bool(torch.isfinite(out).all())


def test_budget_too_small_or_unsupported_is_refused():
    with pytest.raises(ConfigError, match="too small"):
        build_model({"name": "grid", "color": "mlp", "max_params": 1000}, BOX, torch.ones(3))
    with pytest.raises(ConfigError, match="too small"):
        build_model({"name": "ngp", "max_params": 1000}, BOX, torch.ones(3))
    with pytest.raises(ConfigError, match="model=grid and model=ngp"):
        build_model({"name": "nerf", "max_params": 10_000_000}, BOX, torch.ones(3))


def test_scaled_resolutions_keep_ratios():
    assert scaled_resolutions([64, 128, 160], 80) == [32, 64, 80]
    assert scaled_resolutions([2, 3, 100], 10) == [2, 2, 10]
