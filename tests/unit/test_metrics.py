"""Image metrics (distnerf.observe.metrics) and the optimizer helpers (distnerf.engine.optim)."""
from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from distnerf.engine.optim import build_optimizer, lr_factor, rebuild_optimizer, set_lr
from distnerf.model.grid import GridModel
from distnerf.observe.metrics import LPIPS, psnr, ssim

HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None


def _image(seed: int, h: int = 32, w: int = 40) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    # smooth structure plus texture, in [0, 1]
    y = torch.linspace(0, 1, h)[:, None, None]
    x = torch.linspace(0, 1, w)[None, :, None]
    base = 0.5 + 0.3 * torch.sin(6 * x + torch.tensor([0.0, 1.0, 2.0])) * torch.cos(4 * y)
    return (base + 0.1 * torch.rand(h, w, 3, generator=gen)).clamp(0, 1)


# ----------------------------------------------------------------------------- metrics
def test_psnr_formula():
    target = _image(0).double() * 0.8
    assert psnr(target + 0.1, target) == pytest.approx(20.0, abs=1e-9)  # MSE 0.01
    assert psnr(target - 0.01, target) == pytest.approx(40.0, abs=1e-9)  # MSE 1e-4
    t32 = target.float()
    assert psnr(t32 + 0.1, t32) == pytest.approx(20.0, abs=1e-5)  # float32 inputs too
    assert psnr(target, target) == float("inf")
    noisy = (target + 0.05 * torch.randn(target.shape, generator=torch.Generator().manual_seed(1))).clamp(0, 1)
    mse = sum((float(a) - float(b)) ** 2 for a, b in zip(noisy.flatten(), target.flatten())) / target.numel()
    assert psnr(noisy, target) == pytest.approx(-10 * math.log10(mse), rel=1e-9)
    assert psnr(noisy, target) == pytest.approx(psnr(target, noisy))


def test_ssim_identical_and_noisy():
    img = _image(2)
    assert ssim(img, img) == pytest.approx(1.0, abs=1e-5)
    gen = torch.Generator().manual_seed(3)
    slightly = (img + 0.02 * torch.randn(img.shape, generator=gen)).clamp(0, 1)
    very = (img + 0.2 * torch.randn(img.shape, generator=gen)).clamp(0, 1)
    s1, s2 = ssim(slightly, img), ssim(very, img)
    assert s2 < s1 < 1.0 - 1e-4
    assert s2 > -1.0


def test_ssim_constant_offset_affects_only_luminance_term():
    # SSIM of a brightness-shifted copy stays high (structure unchanged), far above noise
    img = _image(4) * 0.8
    shifted = img + 0.05
    noisy = (img + 0.1 * torch.randn(img.shape, generator=torch.Generator().manual_seed(5))).clamp(0, 1)
    assert ssim(shifted, img) > 0.95 > ssim(noisy, img)


def test_lpips_available_or_explains_why():
    metric = LPIPS()
    img = _image(6)
    if metric.available:
        assert metric.reason is None
        assert metric(img, img) == pytest.approx(0.0, abs=1e-4)
        assert metric((img * 0.5), img) > 0.0
    else:
        assert isinstance(metric.reason, str) and "LPIPS" in metric.reason
        assert len(metric.reason) <= 300
        assert metric(img, img) is None


@pytest.mark.skipif(not HAS_TORCHVISION,
                    reason="torchvision is not importable here; LPIPS(random_backbone=True) needs it "
                           "for the AlexNet backbone")
def test_lpips_code_path_with_random_backbone():
    metric = LPIPS(random_backbone=True)
    assert metric.available, metric.reason
    img = _image(7)
    other = _image(8).flip(0)
    d_same, d_other = metric(img, img), metric(other, img)
    assert isinstance(d_same, float) and d_same == pytest.approx(0.0, abs=1e-6)
    assert d_other > d_same
    assert d_other == pytest.approx(metric(img, other), rel=1e-5)  # symmetric


# ----------------------------------------------------------------------------- optimizer
def test_lr_factor_formula():
    cfg = {"decay": 0.1, "decay_steps": 100}
    assert lr_factor(0, cfg) == pytest.approx(1.0)
    assert lr_factor(50, cfg) == pytest.approx(1 / math.sqrt(10))
    assert lr_factor(100, cfg) == pytest.approx(0.1)
    assert lr_factor(300, cfg) == pytest.approx(1e-3)
    # defaults: decay 0.1 over 250k steps, no warm-up
    assert lr_factor(250_000, {}) == pytest.approx(0.1)
    assert lr_factor(125_000, {}) == pytest.approx(0.1 ** 0.5)
    # linear warm-up multiplies by (step + 1) / warmup for step < warmup
    warm = {"decay": 0.5, "decay_steps": 10, "warmup_steps": 4}
    assert lr_factor(0, warm) == pytest.approx(0.25)
    assert lr_factor(2, warm) == pytest.approx(0.5 ** 0.2 * 0.75)
    assert lr_factor(4, warm) == pytest.approx(0.5 ** 0.4)
    assert lr_factor(20, warm) == pytest.approx(0.25)


def _grid_model() -> GridModel:
    torch.manual_seed(0)
    return GridModel(torch.tensor([[-1.0] * 3, [1.0] * 3]), torch.ones(3), resolutions=(6, 8),
                     upsample_steps=(3,), num_features=2, hidden_width=8)


def _train_step(model, opt) -> None:
    opt.zero_grad()
    loss = model.density.square().sum() + model.features.square().sum() + sum(
        p.square().sum() for p in model.color_net.parameters())
    (loss + 1.0 * model.density.sum()).backward()
    opt.step()


def test_build_optimizer_groups_and_set_lr():
    model = _grid_model()
    cfg = {"lr": 1e-3, "decay": 0.1, "decay_steps": 100}
    opt = build_optimizer(model, cfg)
    assert isinstance(opt, torch.optim.Adam)
    names = [g["name"] for g in opt.param_groups]
    assert names == ["grid", "color_net"]
    assert [g["base_lr"] for g in opt.param_groups] == pytest.approx([0.1, 1e-3])
    factor = set_lr(opt, 50, cfg)
    assert factor == pytest.approx(1 / math.sqrt(10))
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.1 * factor, 1e-3 * factor])
    assert opt.defaults["eps"] == pytest.approx(1e-15)


def test_rebuild_optimizer_keeps_state_of_unchanged_params():
    model = _grid_model()
    cfg = {"lr": 1e-3, "decay": 0.1, "decay_steps": 100}
    opt = build_optimizer(model, cfg)
    for _ in range(2):
        _train_step(model, opt)
    set_lr(opt, 30, cfg)
    old_density, old_features = model.density, model.features
    mlp_params = list(model.color_net.parameters())
    kept = {p: {k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state[p].items()}
            for p in mlp_params}
    assert old_density in opt.state and opt.state[old_density]["exp_avg"].abs().sum() > 0

    assert model.update_state(3) is True  # tables replaced by new tensors
    assert model.density is not old_density and model.features is not old_features
    new = rebuild_optimizer(opt, model, cfg)

    # replaced tensors start fresh; MLP parameters keep their moments and step counts
    assert model.density not in new.state and model.features not in new.state
    for p in mlp_params:
        assert p in new.state
        for k, v in kept[p].items():
            assert torch.equal(new.state[p][k], v) if torch.is_tensor(v) else new.state[p][k] == v
    # the optimizer holds exactly the model's current parameters
    held = {id(p) for g in new.param_groups for p in g["params"]}
    assert held == {id(p) for p in model.parameters()}
    assert id(old_density) not in held
    # learning rates carried over from the old optimizer; base rates from the config
    assert [g["lr"] for g in new.param_groups] == pytest.approx([g["lr"] for g in opt.param_groups])
    assert [g["base_lr"] for g in new.param_groups] == pytest.approx([0.1, 1e-3])
    # and it keeps training
    _train_step(model, new)
    assert "exp_avg" in new.state[model.density]
    assert int(new.state[mlp_params[0]]["step"]) == 3
