"""Masked scenes and images of different sizes in the samplers and in evaluation.

A scene's ``mask`` (dataset masks, or the padding of images smaller than the pixel store)
must never be sampled, the remaining pixels must be drawn uniformly, every sampler must
still draw bitwise the same batches, and evaluation must score each view at its own size.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from distnerf.engine.evaluate import evaluate_views
from distnerf.sampler import BatchSpec, DeviceSampler, PipelinedSampler, SyncSampler, make_batch
from distnerf.renderer.output import RenderOutput
from tests.unit.test_sampler import assert_same, tiny_scene

H, W = 12, 16


def masked_scene():
    """5 images; image 1 is 8x10 (padded into 12x16), image 3 fully masked, image 4 half masked."""
    scene = tiny_scene(5, H, W)
    mask = torch.ones(5, H, W, dtype=torch.bool)
    mask[1, 8:, :] = False
    mask[1, :, 10:] = False
    mask[3] = False
    mask[4, :, : W // 2] = False
    sizes = torch.tensor([[H, W], [8, 10], [H, W], [H, W], [H, W]])
    images = scene.images.clone()
    images[~mask] = -1.0  # a masked pixel drawn would show up in the batch's colours
    return replace(scene, images=images, mask=mask, cameras=replace(scene.cameras, sizes=sizes))


@pytest.mark.parametrize("policy", ["uniform", "per_image"])
def test_masked_pixels_are_never_drawn_and_the_rest_uniformly(policy):
    scene = masked_scene()
    spec = BatchSpec(4096, seed=1, stream=0, policy=policy, images_per_step=2)
    flat_rgb = scene.images.reshape(-1, 3)
    counts = torch.zeros(scene.images.shape[0] * H * W)
    for step in range(40):
        batch = make_batch(spec, scene, flat_rgb, step)
        assert (batch.rgb >= 0).all(), "a masked or padding pixel was sampled"
        # recover the drawn pixels from the colours (random colours are unique)
        idx = ((flat_rgb[None] - batch.rgb[:, None]).abs().sum(-1) == 0).float().argmax(1)
        counts += torch.bincount(idx, minlength=counts.numel()).float()
    valid = scene.mask.reshape(-1)
    assert counts[~valid].sum() == 0 and (counts[valid] > 0).float().mean() > 0.99
    if policy == "uniform":  # chi-square-like check: every valid pixel near the same count
        c = counts[valid]
        expected = c.sum() / valid.sum()
        assert ((c - expected) ** 2 / expected).mean() < 2.0
    else:  # per_image: image 3 (fully masked) is never chosen, the others equally often
        per_image = counts.view(5, -1).sum(1)
        assert per_image[3] == 0
        share = per_image[[0, 1, 2, 4]] / per_image.sum()
        assert (share - 0.25).abs().max() < 0.05


def test_every_sampler_draws_the_same_masked_batches():
    scene = masked_scene()
    spec = BatchSpec(512, seed=3, stream=1)
    sync = SyncSampler(scene, spec, "cpu")
    device = DeviceSampler(scene, spec, "cpu")
    pipelined = PipelinedSampler(scene, spec, "cpu", num_workers=2, prefetch=2, start_method="spawn")
    try:
        for step in range(4):
            ref = sync.to_device(sync.host_batch(step))
            assert_same(ref, device.to_device(device.host_batch(step)))
            assert_same(ref, pipelined.to_device(pipelined.host_batch(step)))
    finally:
        pipelined.close()


def test_a_fully_masked_scene_is_a_clear_error():
    scene = masked_scene()
    scene = replace(scene, mask=torch.zeros_like(scene.mask))
    with pytest.raises(ValueError, match="tiny is masked out"):
        make_batch(BatchSpec(8, seed=0, stream=0), scene, scene.images.reshape(-1, 3), 0)


class _ConstantModel(torch.nn.Module):
    """Renders every ray the same grey (an independent, trivial 'model')."""

    def forward(self, rays):
        n = len(rays)
        return RenderOutput(rgb=torch.full((n, 3), 0.5), depth=torch.ones(n), opacity=torch.ones(n),
                            num_samples=torch.tensor(n))


def test_evaluation_scores_each_view_at_its_own_size():
    scene = masked_scene()
    rows = evaluate_views(_ConstantModel(), scene, [0, 1], chunk=64, device="cpu", out_dir=None, lpips=None)
    assert [r["num_rays"] for r in rows] == [H * W, 8 * 10]
    # PSNR of a constant 0.5 against the view's own pixels (padding excluded), computed here
    gt = scene.images[1, :8, :10]
    expected = -10 * np.log10(float(((gt - 0.5) ** 2).mean()))
    assert rows[1]["psnr"] == pytest.approx(expected, abs=1e-4)
