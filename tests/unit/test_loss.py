"""The step's photometric error (distnerf/components/loss.py): the summed loss and the per-ray
means the trainer logs, against values worked out by hand."""
from __future__ import annotations

import pytest
import torch

from distnerf.components.loss import photometric_sse, ray_error
from distnerf.renderer.output import RenderOutput


def _out(**kw) -> RenderOutput:
    return RenderOutput(rgb=torch.tensor([[0.5, 0.5, 0.5], [1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]),
                        depth=torch.zeros(3), opacity=torch.ones(3), **kw)


TARGET = torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.0, 1.0], [0.3, 0.3, 0.3]])
VALID = torch.tensor([True, True, False])  # ray 2 does not count: its error (0.09) must not appear
# per-ray colour MSE: ray 0 (0.25 + 0 + 0) / 3 = 1/12, ray 1 0


def test_the_logged_loss_is_the_mean_per_ray_error_of_the_counted_rays_with_distortion_and_coarse_pass():
    error = ray_error(_out(), TARGET, VALID)
    assert error.sse.item() == pytest.approx(1 / 12)
    assert error.row_means() == pytest.approx((1 / 24, 1 / 24))
    coarse = torch.tensor([[0.5, 0.5, 0.5], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])  # ray 1: (0 + 1 + 0) / 3
    error = ray_error(_out(distortion_loss=torch.tensor([0.1, 0.3, 5.0]), rgb_coarse=coarse), TARGET, VALID)
    # sum over counted rays: colour 1/12, distortion 0.4, coarse 1/12 + 1/3
    assert error.sse.item() == pytest.approx(1 / 12 + 0.4 + 1 / 12 + 1 / 3)
    loss, mse = error.row_means()
    assert loss == pytest.approx((1 / 12 + 0.4 + 1 / 12 + 1 / 3) / 2)  # everything the step trains on
    assert mse == pytest.approx(1 / 24)  # the training PSNR's: the (fine) colour alone
    assert photometric_sse(_out(), TARGET, VALID).item() == pytest.approx(1 / 12)


def test_rows_of_several_sub_models_are_weighted_in_the_sum_and_counted_once_each_in_the_mean():
    """``ss``: ray 0 has a row in two sub-models (``ray_index``), each row weighted 1 / its sub-model's rows."""
    out = RenderOutput(rgb=torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5], [1.0, 0.0, 1.0]]), depth=torch.zeros(3),
                       opacity=torch.ones(3), ray_index=torch.tensor([0, 0, 1]),
                       loss_weight=torch.tensor([1.0, 0.5, 0.5]))
    error = ray_error(out, TARGET, VALID)
    assert error.sse.item() == pytest.approx(1 / 12 * 1.0 + 1 / 12 * 0.5)
    assert error.row_means() == pytest.approx((2 / 36, 2 / 36))  # rows: 1/12, 1/12, 0
    empty = ray_error(_out(), TARGET, torch.zeros(3, dtype=torch.bool))
    assert empty.sse.item() == 0.0 and empty.row_means() == (0.0, 0.0)
