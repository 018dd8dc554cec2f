"""Image quality metrics: PSNR, SSIM (torchmetrics), LPIPS (torchmetrics' AlexNet, when available).

Legend: N images, H, W image size, L backbone layers, C_l channels and H_l, W_l size of
layer l. Images are (H, W, 3) float32 RGB in [0, 1].
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

LPIPS_BACKBONE = "alex"


PSNR_MAX_DB = 100.0  # the MSE is clamped at 1e-10: an exact image (a view of background only) scores 100 dB


def psnr(pred: torch.Tensor, target: torch.Tensor) -> float:
    """Peak signal-to-noise ratio in dB for data range 1: ``-10 log10(max(MSE, 1e-10))``.

    Capped at :data:`PSNR_MAX_DB` (an exact render, e.g. a view whose rays all miss the
    scene, would otherwise score ``inf`` and make a mean over views meaningless).

    Args:
        pred, target: (H, W, 3) float in [0, 1] (or any equal shapes).
    """
    mse = torch.mean((pred.double() - target.double()) ** 2).item()
    return -10.0 * math.log10(max(mse, 10 ** (-PSNR_MAX_DB / 10)))


def ssim(pred: torch.Tensor, target: torch.Tensor) -> float:
    """Structural similarity (Wang et al. 2004), 11x11 Gaussian window, sigma 1.5,
    data range 1, via ``torchmetrics``. pred, target: (H, W, 3) float in [0, 1]."""
    # imported here: torchmetrics pulls in matplotlib (~1.5 s), paid by every rank at start otherwise
    from torchmetrics.functional.image import structural_similarity_index_measure

    p = pred.permute(2, 0, 1)[None].float().clamp(0, 1)
    t = target.permute(2, 0, 1)[None].float()
    return float(structural_similarity_index_measure(p, t, data_range=1.0))


def lpips_distance(feats0: Sequence[torch.Tensor], feats1: Sequence[torch.Tensor],
                   weights: Sequence[torch.Tensor], eps: float = 1e-8) -> torch.Tensor:
    r"""LPIPS distance from backbone features (Zhang et al. 2018, as in torchmetrics and ``lpips``).

    .. math::

        d = \sum_l \frac{1}{H_l W_l} \sum_{h,w} \sum_c w_{l,c} \left(\hat f^0_{l,chw} - \hat f^1_{l,chw}\right)^2,
        \qquad \hat f_{l,chw} = f_{l,chw} / \sqrt{\epsilon + \textstyle\sum_{c'} f_{l,c'hw}^2}

    Features are unit-normalised over channels at each pixel, so each layer adds at most
    :math:`4 \max_c w_{l,c}`. Differentiable (not needed by :class:`LPIPS`).

    Args:
        feats0, feats1: L feature maps (N, C_l, H_l, W_l) of the two images.
        weights: L non-negative channel weights (C_l,) (LPIPS's linear layers).
        eps: added under the square root of the channel norm.
    Returns:
        (N,) distances, 0 for identical features.
    """
    if not len(feats0) == len(feats1) == len(weights) or not weights:
        raise ValueError(f"lpips_distance: {len(feats0)}, {len(feats1)} feature maps, {len(weights)} weights")
    total = 0.0
    for f0, f1, w in zip(feats0, feats1, weights):
        n0 = f0 / torch.sqrt(eps + f0.square().sum(1, keepdim=True))
        n1 = f1 / torch.sqrt(eps + f1.square().sum(1, keepdim=True))
        total = total + ((n0 - n1).square() * w.reshape(1, -1, 1, 1)).sum(1).mean((1, 2))
    return total


def alexnet_lpips(random_backbone: bool = False) -> tuple[nn.Module, list[torch.Tensor]]:
    """The LPIPS (alex) backbone and weights: torchmetrics' AlexNet feature slices (relu1..relu5)
    behind LPIPS's input scaling, and the linear-layer weights shipped with torchmetrics
    (``lpips_models/alex.pth``).

    Args:
        random_backbone: randomly initialised AlexNet instead of torchvision's ImageNet weights.
    Raises:
        ModuleNotFoundError: torchvision not importable; whatever torchvision raises when the
        ImageNet weights are not in its cache and cannot be downloaded.
    """
    from torchmetrics.functional.image import lpips as tm_lpips

    backbone = nn.Sequential(tm_lpips.ScalingLayer(), tm_lpips.Alexnet(pretrained=not random_backbone))
    path = Path(inspect.getfile(tm_lpips)).parent / "lpips_models" / f"{LPIPS_BACKBONE}.pth"
    state = torch.load(path, map_location="cpu", weights_only=True)
    return backbone, [state[f"lin{i}.model.1.weight"].flatten() for i in range(5)]


class LPIPS:
    """LPIPS (Zhang et al. 2018): :func:`lpips_distance` of a backbone's features.

    The backbone comes from ``factory``; by default torchmetrics' AlexNet with
    torchvision's ImageNet weights (:func:`alexnet_lpips`). When the factory fails
    (torchvision missing, weights not on disk), :attr:`available` is False,
    :attr:`reason` says why and ``__call__`` returns None.

    Args:
        factory: ``() -> (backbone, weights)``: ``backbone`` maps (N, 3, H, W) float32 images
            in [-1, 1] to L feature maps (N, C_l, H_l, W_l); ``weights``: L tensors (C_l,).
    """

    def __init__(self, factory: Callable[[], tuple[nn.Module, Sequence[torch.Tensor]]] | None = None):
        self.backbone, self.weights, self.reason = None, None, None
        name = LPIPS_BACKBONE if factory is None else getattr(factory, "__name__", "custom")
        try:
            backbone, weights = (factory or alexnet_lpips)()
            self.weights = [torch.as_tensor(w).detach().float().flatten() for w in weights]
            self.backbone = backbone.eval().requires_grad_(False)
        except Exception as err:  # noqa: BLE001 - any failure means "not available", with its reason
            self.reason = f"LPIPS ({name}) unavailable: {type(err).__name__}: {err}"[:300]

    @property
    def available(self) -> bool:
        return self.backbone is not None

    @torch.no_grad()
    def __call__(self, pred: torch.Tensor, target: torch.Tensor) -> float | list[float] | None:
        """LPIPS distance (lower is better), or None when not available.

        Args:
            pred, target: (H, W, 3) or (N, H, W, 3) float RGB in [0, 1] (``pred`` is clamped).
        Returns:
            a float for one image, N floats for a batch, None when not :attr:`available`.
        """
        if self.backbone is None:
            return None
        if pred.shape != target.shape or pred.dim() not in (3, 4) or pred.shape[-1] != 3:
            raise ValueError(f"LPIPS: pred {tuple(pred.shape)} and target {tuple(target.shape)} must both be "
                             "(H, W, 3) or (N, H, W, 3)")
        p = pred.reshape(-1, *pred.shape[-3:]).permute(0, 3, 1, 2).float().clamp(0, 1) * 2 - 1
        t = target.reshape(-1, *target.shape[-3:]).permute(0, 3, 1, 2).float() * 2 - 1
        self.backbone.to(p.device)
        weights = [w.to(p.device) for w in self.weights]
        d = lpips_distance(self.backbone(p), self.backbone(t), weights)
        return float(d[0]) if pred.dim() == 3 else d.tolist()
