"""Image metrics (distnerf.observe.metrics) and the optimizer helpers (distnerf.components.optim)."""
from __future__ import annotations

import json
import math

import pytest
import torch

from distnerf.components.optim import build_optimizer, rebuild_optimizer, set_lr
from distnerf.components.schedule import lr_factor
from distnerf.config_check import section
from distnerf.model.grid import GridModel
from distnerf.observe.metrics import LPIPS, alexnet_lpips, psnr, ssim
from distnerf.schema import OptimConfig, TrainLoopConfig

TRAIN = section(TrainLoopConfig)  # the run's length: the defaults (the rates below are keyed to decay_steps)


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
    assert psnr(target, target) == 100.0  # capped (MSE clamped at 1e-10): never inf in a mean or in JSON
    assert psnr(target + 1e-6, target) == 100.0 and psnr(target + 1e-4, target) == pytest.approx(80.0, abs=1e-6)
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


class _StandInBackbone(torch.nn.Module):
    """Two fixed random conv layers (seeded): features at full and half resolution."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(11)
        self.conv1 = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(4, 5, 3, stride=2, padding=1)
        for conv in (self.conv1, self.conv2):
            conv.weight.data = torch.randn(conv.weight.shape, generator=gen)
            conv.bias.data = 0.1 * torch.randn(conv.bias.shape, generator=gen)

    def forward(self, x):
        h1 = torch.relu(self.conv1(x))
        return h1, self.conv2(h1)


def _lpips_by_hand(backbone, weights, pred, target) -> float:
    """The LPIPS formula pixel by pixel in float64: each layer's feature vector divided by
    sqrt(1e-8 + its squared norm), the weighted squared difference summed over channels,
    averaged over the layer's pixels, summed over layers; images (H, W, 3) in [0, 1]."""
    def feats(img):  # the backbone's input convention: (1, 3, H, W) in [-1, 1]
        x = torch.stack([img[..., c] for c in range(3)])[None].float()
        return [f[0].double() for f in backbone(2 * x - 1)]

    total = 0.0
    for f0, f1, w in zip(feats(pred.clamp(0, 1)), feats(target), weights):
        _, h, wd = f0.shape
        layer = 0.0
        for i in range(h):
            for j in range(wd):
                a, b = f0[:, i, j], f1[:, i, j]
                a, b = a / math.sqrt(1e-8 + float(a @ a)), b / math.sqrt(1e-8 + float(b @ b))
                layer += sum(float(w[c]) * float(a[c] - b[c]) ** 2 for c in range(len(a)))
        total += layer / (h * wd)
    return total


def test_lpips_with_a_stand_in_backbone():
    backbone = _StandInBackbone()
    weights = [torch.tensor([0.5, 1.0, 0.25, 2.0]), torch.tensor([1.0, 0.1, 0.7, 1.3, 0.4])]
    metric = LPIPS(lambda: (backbone, weights))
    assert metric.available and metric.reason is None
    img, other = _image(7, h=12, w=10), _image(8, h=12, w=10).flip(0)
    d = metric(other, img)
    assert isinstance(d, float) and d == pytest.approx(_lpips_by_hand(backbone, weights, other, img), rel=1e-5)
    assert metric(img, img) == pytest.approx(0.0, abs=1e-7)
    assert metric(img, other) == pytest.approx(d, rel=1e-5)  # symmetric
    # unit vectors differ by at most 2: each layer adds at most 4 * its largest weight
    assert 0.0 < d <= 4 * sum(float(w.max()) for w in weights)
    assert metric(other * 3 - 1, img) == pytest.approx(metric((other * 3 - 1).clamp(0, 1), img), rel=1e-6)
    # a batch: one value per image pair, each as if alone
    batch = metric(torch.stack([other, img, 1 - img]), torch.stack([img, img, img]))
    assert isinstance(batch, list) and batch == pytest.approx([d, 0.0, metric(1 - img, img)], rel=1e-5, abs=1e-7)
    with pytest.raises(ValueError, match="must both be"):
        metric(img, img[:6])


def test_lpips_unavailable_backbone_gives_null_with_its_reason():
    def no_torchvision():
        raise ModuleNotFoundError("No module named 'torchvision'")

    metric = LPIPS(no_torchvision)
    assert not metric.available and metric(_image(6), _image(6)) is None
    assert metric.reason == "LPIPS (no_torchvision) unavailable: ModuleNotFoundError: No module named 'torchvision'"

    def long_failure():
        raise RuntimeError("x" * 1000)

    assert len(LPIPS(long_failure).reason) == 300  # cut to fit a metrics.json row


def test_lpips_matches_torchmetrics_for_the_same_alexnet(monkeypatch):
    """distnerf's LPIPS (alexnet_lpips: scaling, AlexNet slices, the linear weights torchmetrics
    ships) against torchmetrics' own _LPIPS, both on one random AlexNet-shaped network (what
    torchvision would provide)."""
    from torchmetrics.functional.image import lpips as tm_lpips

    torch.manual_seed(3)
    c = torch.nn
    features = c.Sequential(c.Conv2d(3, 64, 11, 4, 2), c.ReLU(), c.MaxPool2d(3, 2), c.Conv2d(64, 192, 5, padding=2),
                            c.ReLU(), c.MaxPool2d(3, 2), c.Conv2d(192, 384, 3, padding=1), c.ReLU(),
                            c.Conv2d(384, 256, 3, padding=1), c.ReLU(), c.Conv2d(256, 256, 3, padding=1), c.ReLU())
    monkeypatch.setattr(tm_lpips, "_get_tv_model_features", lambda net, pretrained=False: features)
    reference = tm_lpips._LPIPS(pretrained=True, net="alex", pnet_rand=True).eval()
    metric = LPIPS(lambda: alexnet_lpips(random_backbone=True))
    assert metric.available, metric.reason
    imgs = torch.stack([_image(9, 64, 64), _image(10, 64, 64)])
    targets = torch.stack([_image(11, 64, 64).flip(1), _image(10, 64, 64)])
    with torch.no_grad():
        expected = reference(imgs.permute(0, 3, 1, 2), targets.permute(0, 3, 1, 2), normalize=True).flatten()
    assert metric(imgs, targets) == pytest.approx(expected.tolist(), rel=1e-5, abs=1e-7)
    assert expected[0] > 0.0


# ----------------------------------------------------------------------------- optimizer
def test_lr_factor_formula():
    cfg = section(OptimConfig, decay=0.1, decay_steps=100)
    assert lr_factor(0, cfg, TRAIN) == pytest.approx(1.0)
    assert lr_factor(50, cfg, TRAIN) == pytest.approx(1 / math.sqrt(10))
    assert lr_factor(100, cfg, TRAIN) == pytest.approx(0.1)
    assert lr_factor(300, cfg, TRAIN) == pytest.approx(1e-3)
    # linear warm-up multiplies by (step + 1) / warmup for step < warmup
    warm = section(OptimConfig, decay=0.5, decay_steps=10, warmup_steps=4)
    assert lr_factor(0, warm, TRAIN) == pytest.approx(0.25)
    assert lr_factor(2, warm, TRAIN) == pytest.approx(0.5 ** 0.2 * 0.75)
    assert lr_factor(4, warm, TRAIN) == pytest.approx(0.5 ** 0.4)
    assert lr_factor(20, warm, TRAIN) == pytest.approx(0.25)


def _grid_model() -> GridModel:
    torch.manual_seed(0)
    return GridModel(torch.tensor([[-1.0] * 3, [1.0] * 3]), torch.ones(3), resolutions=(6, 8),
                     upsample_steps=(3,), num_features=2, hidden_width=8, color="mlp")


def _train_step(model, opt) -> None:
    opt.zero_grad()
    loss = model.density.square().sum() + model.features.square().sum() + sum(
        p.square().sum() for p in model.color_net.parameters())
    (loss + 1.0 * model.density.sum()).backward()
    opt.step()


def test_build_optimizer_groups_and_set_lr():
    model = _grid_model()
    cfg = section(OptimConfig, lr=1e-3, decay=0.1, decay_steps=100)
    opt = build_optimizer(model, cfg)
    assert isinstance(opt, torch.optim.Adam)
    names = [g["name"] for g in opt.param_groups]
    assert names == ["grid", "color_net"]
    assert [g["base_lr"] for g in opt.param_groups] == pytest.approx([0.1, 1e-3])
    factor = set_lr(opt, 50, cfg, TRAIN)
    assert factor == pytest.approx(1 / math.sqrt(10))
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.1 * factor, 1e-3 * factor])
    assert opt.defaults["eps"] == pytest.approx(1e-15)


def test_rebuild_optimizer_keeps_state_of_unchanged_params():
    model = _grid_model()
    cfg = section(OptimConfig, lr=1e-3, decay=0.1, decay_steps=100)
    opt = build_optimizer(model, cfg)
    for _ in range(2):
        _train_step(model, opt)
    set_lr(opt, 30, cfg, TRAIN)
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


def test_an_exact_view_is_named_and_left_out_of_the_mean(tmp_path):
    """The issue's case: six views of 22.5-24.6 dB and one whose rays all miss the scene (an exact, capped
    100 dB render) must report the mean of the six (23.55 dB), not 34.35 dB."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from distnerf.engine.evaluate import evaluate_run
    from distnerf.observe.metrics import PSNR_MAX_DB

    values = [22.5, 23.0, 23.4, 23.6, 24.2, 24.6]
    rows = [{"name": f"r_{i}", "psnr": p, "ssim": 0.8, "lpips": None, "constant_psnr": 10.0, "num_rays": 4,
             "seconds": 1.0, "rays_per_s": 4.0} for i, p in enumerate(values)]
    rows.append({"name": "r_sky", "psnr": PSNR_MAX_DB, "ssim": 1.0, "lpips": None, "constant_psnr": PSNR_MAX_DB,
                 "num_rays": 4, "seconds": 1.0, "rays_per_s": 4.0})
    scene = SimpleNamespace(height=2, width=2, cameras=SimpleNamespace(sizes=None), background=(1.0, 1.0, 1.0),
                            source="s", transform=None)
    cfg = OmegaConf.create({"eval": {"lpips": False, "downscale": 1, "num_views": None}, "model": {"appearance": "none"}})
    strategy = SimpleNamespace(env=SimpleNamespace(is_main=True))
    out = evaluate_run(cfg, torch.nn.Linear(1, 1), strategy, tmp_path, 5,
                       lambda *a: {"rows": rows, "scene": scene, "fusion_timing": None})
    assert out["psnr"] == pytest.approx(sum(values) / 6) and out["ssim"] == pytest.approx(0.8)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["perfect_views"] == ["r_sky"] and metrics["num_scored_views"] == 6
    assert "left out" in metrics["protocol"]["psnr"]
    every = evaluate_run(cfg, torch.nn.Linear(1, 1), strategy, tmp_path, 5,
                         lambda *a: {"rows": rows[-1:], "scene": scene, "fusion_timing": None})
    assert every["psnr"] == PSNR_MAX_DB  # every view exact: their mean, named
