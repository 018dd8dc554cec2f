"""Image quality metrics: PSNR, SSIM (torchmetrics), LPIPS (torchmetrics, when available).

Legend: H, W image size. Images are (H, W, 3) float32 RGB in [0, 1].
"""
from __future__ import annotations

import math

import torch
from torchmetrics.functional.image import structural_similarity_index_measure

LPIPS_BACKBONE = "alex"


def psnr(pred: torch.Tensor, target: torch.Tensor) -> float:
    """Peak signal-to-noise ratio in dB for data range 1: ``-10 log10(MSE)``.

    Args:
        pred, target: (H, W, 3) float in [0, 1] (or any equal shapes).
    """
    mse = torch.mean((pred.double() - target.double()) ** 2).item()
    return float("inf") if mse == 0 else -10.0 * math.log10(mse)


def ssim(pred: torch.Tensor, target: torch.Tensor) -> float:
    """Structural similarity (Wang et al. 2004), 11x11 Gaussian window, sigma 1.5,
    data range 1, via ``torchmetrics``. pred, target: (H, W, 3) float in [0, 1]."""
    p = pred.permute(2, 0, 1)[None].float().clamp(0, 1)
    t = target.permute(2, 0, 1)[None].float()
    return float(structural_similarity_index_measure(p, t, data_range=1.0))


class LPIPS:
    """LPIPS (Zhang et al. 2018) through torchmetrics with an AlexNet backbone.

    The backbone and linear-layer weights must already be on disk (no download here).
    When they are not, :attr:`available` is False and :attr:`reason` says why;
    ``__call__`` then returns None.

    Args:
        random_backbone: use a randomly initialised backbone (to test the code path).
    """

    def __init__(self, random_backbone: bool = False):
        self.net, self.reason = None, None
        try:
            from torchmetrics.functional.image.lpips import _LPIPS

            self.net = _LPIPS(pretrained=True, net=LPIPS_BACKBONE, pnet_rand=random_backbone).eval()
        except Exception as err:  # noqa: BLE001 - any failure means "not available", with its reason
            self.reason = f"LPIPS ({LPIPS_BACKBONE}) unavailable: {type(err).__name__}: {err}"[:300]

    @property
    def available(self) -> bool:
        return self.net is not None

    @torch.no_grad()
    def __call__(self, pred: torch.Tensor, target: torch.Tensor) -> float | None:
        """LPIPS distance of (H, W, 3) images in [0, 1] (lower is better), or None."""
        if self.net is None:
            return None
        p = pred.permute(2, 0, 1)[None].float().clamp(0, 1) * 2 - 1
        t = target.permute(2, 0, 1)[None].float() * 2 - 1
        return float(self.net(p, t).mean())
