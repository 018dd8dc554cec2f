"""``ss`` joint training is exact: with K regions on 2 ranks, the loss and every region's
gradients equal those of ONE process holding all K sub-fields that renders the union of
their samples along each ray in a single volume-rendering pass (float64, gloo).

The reference follows the sampling contract, not the code: one jitter ``u`` per ray,
drawn first from the step's generator; region k marches its segment (the ray clipped to
the region's box and to the sub-model's marching box) on the ray's sample grid anchored
at ``near + u step_k / |d|``, in its occupied cells. Each sub-model renders its segment
without knowledge of the others, so its rules see its *own* segment only: early
termination keeps a sample while the transmittance inside the segment before it exceeds
``termination``, and a sample gets a colour where its weight inside the segment exceeds
``color_threshold`` (both at the models' defaults, 1e-4 and 1e-3; the sub-models set
``train_termination``, so that training cuts as evaluation does). The kept samples of
all regions are then merged along the ray and rendered in one differentiable pass
(transmittance as a running product of ``exp(-tau)``, in a padded per-ray layout).
"""
from __future__ import annotations

import math

import pytest
import torch

from distnerf.renderer.occupancy import march
from distnerf.renderer.samples import clip_to_box as clip_segment
from distnerf.strategy.joint import clip_to_box
from tests.conftest import spawn
from tests.dist.joint_workers import BG, JITTER_SEED, joint_worker, region_models
from tests.dist.workers import make_problem


def segment_masks(ray, t0, t1, sigma, termination: float, threshold: float):
    """Per-segment rules of a sub-model (python loop over one region's samples, sorted by
    ray then t): kept (local transmittance before the sample > termination) and coloured
    (local weight > threshold)."""
    trans, kept, coloured = {}, [], []
    for r, a, b, s in zip(ray.tolist(), t0.tolist(), t1.tolist(), sigma.tolist()):
        t = trans.get(r, 1.0)
        alpha = 1.0 - math.exp(-s * (b - a))
        kept.append(t > termination)
        coloured.append(t > termination and t * alpha > threshold)
        trans[r] = t * (1.0 - alpha)
    return torch.tensor(kept, dtype=torch.bool), torch.tensor(coloured, dtype=torch.bool)


def union_loss(num_regions: int):
    """Reference (module docstring): loss, colour and gradients of the one-pass render."""
    part, models = region_models(num_regions, list(range(num_regions)))
    rays, target = make_problem(48, seed=3)
    r = len(rays)
    u = torch.rand(r, generator=torch.Generator().manual_seed(JITTER_SEED), dtype=torch.float64)
    o, d = rays.origins, rays.directions
    ray, t0, t1, sig, rgb = [], [], [], [], []
    num_cut = num_dark = 0  # samples behind a termination cut; kept samples without colour
    for k, m in models.items():
        assert m.termination == 1e-4 and m.color_threshold == 1e-3  # the defaults are tested
        step = m.step_size()
        t_in, t_out, _ = clip_to_box(rays, part.boxes[k])
        t_in, t_out = clip_segment(o, d, t_in, t_out, m.marching_box().double())
        s = march(o, d, rays.near + u * step / d.norm(dim=-1), t_in, t_out, step, m.occupancy)
        pts = s.points(o, d)
        with torch.no_grad():
            kept, coloured = segment_masks(s.ray_indices, s.t_starts, s.t_ends, m.field_density(pts),
                                           m.termination, m.color_threshold)
        num_cut += int((~kept).sum())
        num_dark += int((kept & ~coloured).sum())
        col = torch.zeros(int(kept.sum()), 3, dtype=torch.float64)
        c_idx = coloured[kept].nonzero().view(-1)
        col = col.index_put((c_idx,), m.field_rgb(pts[kept][c_idx], rays.viewdirs[s.ray_indices[kept][c_idx]]))
        ray.append(s.ray_indices[kept]), t0.append(s.t_starts[kept]), t1.append(s.t_ends[kept])
        sig.append(m.field_density(pts[kept])), rgb.append(col)
    assert num_cut > 0 and num_dark > 0, (num_cut, num_dark)  # both rules act on this problem
    ray, t0, t1, sig, rgb = (torch.cat(x) for x in (ray, t0, t1, sig, rgb))
    # padded per-ray layout, sorted front to back; padding: zero-length, zero density, no colour
    order = sorted(range(ray.shape[0]), key=lambda i: (int(ray[i]), float(t0[i])))
    counts = torch.bincount(ray, minlength=r)
    width = int(counts.max())
    slot = torch.zeros(ray.shape[0], dtype=torch.long)
    seen = [0] * r
    for i in order:
        slot[i] = seen[int(ray[i])]
        seen[int(ray[i])] += 1
    tau = torch.zeros(r, width, dtype=torch.float64).index_put((ray, slot), sig * (t1 - t0))
    col = torch.zeros(r, width, 3, dtype=torch.float64).index_put((ray, slot), rgb)
    survive = torch.exp(-tau)  # 1 - alpha
    trans = torch.cumprod(torch.cat([torch.ones(r, 1, dtype=torch.float64), survive], dim=1), dim=1)
    weights = trans[:, :-1] * (1.0 - survive)
    out_rgb = (weights[..., None] * col).sum(dim=1) + trans[:, -1:] * BG
    loss = ((out_rgb - target) ** 2).mean(dim=-1).sum() / r
    loss.backward()
    grads = {k: {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None} for k, m in models.items()}
    return loss.detach(), out_rgb.detach(), grads


@pytest.mark.parametrize("num_regions,routed", [(2, False), (4, False), (4, True)],
                         ids=["K=2", "K=4 (2 per rank)", "K=4 routed"])
def test_joint_loss_and_gradients_equal_single_process_union(num_regions, routed, tmp_path):
    """Gathered: every rank renders all rays. Routed (``strategy.joint_exchange=route``, issue 50 item 3):
    each rank owns half the rays and sends each to the ranks whose regions it crosses; the two ranks'
    colours are the reference's halves, their losses sum to its loss, and every sub-model's gradient (the
    sum of both owners' shares, through the routed values' backward) equals the reference's."""
    spawn(joint_worker, 2, num_regions, str(tmp_path), routed, timeout=240)
    ref_loss, ref_rgb, ref_grads = union_loss(num_regions)
    results = [torch.load(tmp_path / f"rank_{r}.pt", weights_only=False) for r in range(2)]
    assert float(ref_loss) > 1e-3
    if routed:
        total = sum(res["loss"] for res in results)
        assert torch.allclose(total, ref_loss, atol=1e-12, rtol=0)
        assert torch.allclose(torch.cat([res["rgb"] for res in results]), ref_rgb, atol=1e-12, rtol=0)
    seen = set()
    for res in results:
        if not routed:
            assert torch.allclose(res["loss"], ref_loss, atol=1e-12, rtol=0)
            assert torch.allclose(res["rgb"], ref_rgb, atol=1e-12, rtol=0)
        for k, grads in res["grads"].items():
            seen.add(k)
            assert grads.keys() == ref_grads[k].keys() and grads
            for n, g in grads.items():
                assert float(ref_grads[k][n].abs().max()) > 0, (k, n)
                assert torch.allclose(g, ref_grads[k][n], atol=1e-12, rtol=1e-9), (k, n)
    assert seen == set(range(num_regions))
