"""Evaluation rounds in a fixed layout (distnerf/renderer/rounds.py, issue 49 item 6), run on the CPU
inside ``sync_free_paths()`` against the dynamic rounds (compaction, a size read per round): the same
samples, pixels and counts, and host syncs per chunk that do not grow with the number of rounds
(:class:`~distnerf.observe.syncs.SyncCounter`)."""
from __future__ import annotations

import math

import pytest
import torch

from distnerf.host_buffers import sync_free_paths
from distnerf.observe.syncs import SyncCounter
from distnerf.renderer.marching import render_segment
from distnerf.renderer.rounds import march_rounds_fixed, num_rounds
from tests.unit.test_packed import grid_model, sphere_rays


def _render(model, rays, free: bool):
    with torch.no_grad(), sync_free_paths(free), SyncCounter() as syncs:
        out = model(rays)
    return out, syncs


@pytest.mark.parametrize("round_steps,termination", [(3, 1e-4), (64, 1e-4), (5, 0.0)])
def test_fixed_rounds_render_the_dynamic_rounds_pixels(round_steps, termination):
    """float64: the same marched and coloured sample counts, pixels equal to rounding of the transmittance
    sums (a row cumsum per round against the packed layout's global one)."""
    model = grid_model(seed=1).eval()
    model.eval_round_steps, model.termination = round_steps, termination
    rays = sphere_rays(300, 1)
    dynamic, _ = _render(model, rays, False)
    fixed, _ = _render(model, rays, True)
    assert float(dynamic["opacity"].max()) > 0.999 and float(dynamic["opacity"].min()) < 0.5
    for key in ("num_samples", "num_density_samples", "num_colour_samples"):
        assert fixed[key] == dynamic[key] > 500, key
    for key in ("rgb", "depth", "opacity"):
        torch.testing.assert_close(fixed[key], dynamic[key], rtol=0, atol=1e-10, msg=key)


def test_fixed_rounds_with_transmittance_in_front_and_float32_psnr():
    """A segment with ``in_front`` (ss fusion's and joint training's regime), float32 like a run: pixels
    within float32 rounding and the PSNR against a float64 reference within 0.05 dB."""
    model64 = grid_model(seed=3).eval()
    rays64 = sphere_rays(400, 4)
    with torch.no_grad():
        reference = model64(rays64)["rgb"]
    model, rays = model64.float(), rays64.map(lambda t: t.float())
    in_front = torch.rand(400, generator=torch.Generator().manual_seed(5)) * 0.9 + 0.1
    outs = []
    for free in (False, True):
        with torch.no_grad(), sync_free_paths(free):
            outs.append(render_segment(model.field_density, model.colours, model.marcher(), rays.origins,
                                       rays.directions, rays.viewdirs, rays.near, rays.near, rays.far,
                                       background=torch.ones(3), colour_threshold=1e-3, termination=1e-4,
                                       in_front=in_front, step_size=model.step_size(), round_steps=4))
    dynamic, fixed = outs
    assert fixed["num_samples"] == dynamic["num_samples"] > 500
    torch.testing.assert_close(fixed["rgb"], dynamic["rgb"], rtol=0, atol=1e-5)

    def psnr(x):
        return -10 * math.log10(float((x.double() - reference).square().mean()))

    assert abs(psnr(fixed["rgb"]) - psnr(dynamic["rgb"])) < 0.05


def test_host_syncs_per_chunk_do_not_grow_with_the_rounds():
    """The dynamic rounds read sizes every round (more rounds, more syncs); the fixed rounds read once
    per chunk (their sizes together) plus the colour pass's read, whatever the number of rounds."""
    model = grid_model(seed=1).eval()
    rays = sphere_rays(300, 1)
    step = model.step_size()
    counts = {}
    for round_steps in (2, 64):
        model.eval_round_steps = round_steps
        counts[round_steps] = (_render(model, rays, False)[1].total, _render(model, rays, True)[1].by_op())
    assert num_rounds(model.occupancy, step, 2) >= 10 * num_rounds(model.occupancy, step, 64)
    assert counts[2][0] > counts[64][0] + 20  # dynamic: several reads per round
    assert counts[2][1] == counts[64][1] == {"Tensor.tolist": 1, "aten.nonzero": 1}


def test_a_round_that_overflows_its_capacity_is_marched_again():
    """Packing each round's occupied slots into fewer rows than slots (``capacity`` < 1) would drop
    densities; the overflow is counted on the device and the chunk marched again at full capacity:
    the same samples, one read more."""
    model = grid_model(seed=1).eval()
    rays = sphere_rays(200, 2)
    t_lo, t_hi = model.marcher().clip(rays.origins, rays.directions, rays.near, rays.far)
    args = (model.field_density, model.occupancy, rays.origins, rays.directions, rays.near, t_lo, t_hi, 1e-4,
            None, model.step_size(), 8)
    with torch.no_grad():
        march_rounds_fixed(*args)  # warm-up: a grid's first lookup makes its strides tensor (a copy, once)
    results = {}
    for capacity in (1.0, 0.01, 0.9):
        with torch.no_grad(), SyncCounter() as syncs:
            results[capacity] = march_rounds_fixed(*args, capacity=capacity), syncs.total
    (full, full_syncs), (small, small_syncs), (ample, ample_syncs) = results[1.0], results[0.01], results[0.9]
    assert full_syncs == ample_syncs == 1 and small_syncs == 2
    for other in (small, ample):
        assert other[2] == full[2] > 500
        assert torch.equal(other[0].ray_indices, full[0].ray_indices)
        torch.testing.assert_close(other[1], full[1], rtol=0, atol=0)
        torch.testing.assert_close(other[3][1], full[3][1], rtol=0, atol=0)
    with pytest.raises(ValueError):
        march_rounds_fixed(*args, capacity=0.0)


def test_too_few_rounds_fail_loudly(monkeypatch):
    """The number of rounds is a bound from the occupied box's diagonal; were it too small, a ray still
    marching after the last round would be cut silently: a device-side assert refuses it."""
    import distnerf.renderer.rounds as rounds

    model = grid_model(seed=1).eval()
    model.eval_round_steps, model.termination = 4, 0.0
    assert rounds.num_rounds(model.occupancy, model.step_size(), 4) > 2
    monkeypatch.setattr(rounds, "num_rounds", lambda *args: 2)
    with pytest.raises(RuntimeError, match="longer than the rounds"):
        _render(model, sphere_rays(50, 1), True)
