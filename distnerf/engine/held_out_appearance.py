"""A test view's per-image appearance (``model.appearance``, :mod:`distnerf.model.appearance`).

A test view has no row in the training table and its rays carry no image ids, so the table is
never indexed by a test id. ``eval.appearance`` chooses the code it is rendered with: ``mean``
(the mean of the training codes, the default) or ``fit_left_half`` (NeRF-W, Martin-Brualla et
al. 2021, Sec. 6: a code initialised to the mean is optimised on the view's left half, model
weights frozen, and the view is scored on its right half only). The protocol is stated in
``metrics.json`` (``protocol.appearance``).
"""
from __future__ import annotations

import time

import torch

from ..data.base import SceneData
from ..data.rays import image_rays
from ..model.appearance import Appearance
from ..config_check import ConfigError, section
from ..schema import EvalConfig


def appearance_tables(model) -> list[Appearance]:
    """The per-image appearance tables inside ``model`` (one per sub-model of a fusion stage)."""
    return [m for m in model.modules() if isinstance(m, Appearance)]


def fit_appearance(model, scene: SceneData, index: int, device, eval_cfg=None) -> dict:
    """NeRF-W's held-out appearance (``eval.appearance=fit_left_half``): set every appearance
    table's :attr:`~distnerf.model.appearance.Appearance.held_out` code to one fitted on the
    left half (columns ``u < W // 2``) of view ``index``.

    Each code starts at its table's mean row and takes ``eval.appearance_steps`` Adam steps
    (lr ``eval.appearance_lr``) on the MSE of ``eval.appearance_rays`` left-half pixels per step,
    drawn with a generator seeded by the view index; the model's weights get no gradient
    (``torch.autograd.grad`` w.r.t. the codes only) and render in evaluation mode, as scored.
    The codes stay set until :func:`clear_appearance`.

    Returns:
        ``{"fit_loss": final MSE, "fit_seconds": s}`` (empty when the model has no table).
    Raises:
        ValueError: the renderer gives no gradient (the ``ss`` fusion stage renders without).
    """
    cfg = section(EvalConfig, eval_cfg)
    tables = appearance_tables(model)
    if not tables:
        return {}
    start = time.perf_counter()
    codes = [t.mean_code().detach().clone().requires_grad_(True) for t in tables]
    for t, code in zip(tables, codes):
        t.held_out = code
    rays = image_rays(scene.cameras, index, scene.near, scene.far, scene.ndc)
    gt = scene.image(index)  # (H, W, 3)
    h, w = gt.shape[:2]
    left = (torch.arange(h)[:, None] * w + torch.arange(w // 2)[None, :]).reshape(-1)  # row-major pixel indices
    target = gt.reshape(-1, 3)
    gen = torch.Generator().manual_seed(int(index))
    optimizer = torch.optim.Adam(codes, lr=cfg.appearance_lr)
    was_training = model.training
    model.eval()
    loss = torch.zeros(())
    with torch.enable_grad():
        for _ in range(cfg.appearance_steps):
            pick = left[torch.randint(len(left), (min(cfg.appearance_rays, len(left)),), generator=gen)]
            out = model(rays.map(lambda t: t[pick].to(device)))
            loss = ((out.rgb.float() - target[pick].to(device)) ** 2).mean()
            if not loss.requires_grad:
                model.train(was_training)
                raise ValueError("eval.appearance=fit_left_half optimises a code through the renderer, but it "
                                 f"renders without gradients ({type(model).__name__}; the ss fusion stage does): "
                                 "use eval.appearance=mean")
            grads = torch.autograd.grad(loss, codes, allow_unused=True)  # the codes only: weights stay frozen
            for code, g in zip(codes, grads):
                code.grad = torch.zeros_like(code) if g is None else g
            optimizer.step()
    model.train(was_training)
    for t, code in zip(tables, codes):
        t.held_out = code.detach()
    return {"fit_loss": float(loss.detach()), "fit_seconds": time.perf_counter() - start}


def clear_appearance(model) -> None:
    """Back to the mean code for rays without image ids (undoes :func:`fit_appearance`)."""
    for t in appearance_tables(model):
        t.held_out = None


def check_appearance_protocol(cfg) -> None:
    """Refuse, before training, an ``eval.appearance`` the run's evaluation cannot do.

    Raises:
        ConfigError: ``fit_left_half`` with a per-image appearance under ``strategy=ss``, whose
            fusion stage renders without gradients (no code can be fitted through it).
    """
    if cfg.eval.appearance == "fit_left_half" and cfg.model.appearance != "none" and cfg.strategy.name == "ss":
        raise ConfigError("config eval.appearance=fit_left_half fits a code through the renderer, but the "
                          "strategy=ss fusion stage renders without gradients: use eval.appearance=mean")


def appearance_protocol(cfg, model) -> str:
    """How test views get a per-image appearance, in words (``protocol.appearance`` of metrics.json)."""
    if not appearance_tables(model):
        return "none (the model has no per-image appearance)"
    kind = cfg.model.appearance
    if cfg.eval.appearance == "mean":
        return (f"mean: model.appearance={kind}, each test view rendered with the mean of the training images' "
                "codes (test ids never index the table); whole view scored")
    return (f"fit_left_half (NeRF-W): model.appearance={kind}, a code per test view initialised to the training "
            f"mean and fitted on the view's left half (columns u < W/2; {cfg.eval.appearance_steps} Adam steps, "
            f"lr {cfg.eval.appearance_lr}, {cfg.eval.appearance_rays} rays per step; model weights frozen); "
            "PSNR/SSIM/LPIPS on the right half only")
