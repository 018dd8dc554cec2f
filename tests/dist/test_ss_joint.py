"""``ss`` joint training is exact: with K regions on 2 ranks, the loss and every region's
gradients equal those of ONE process holding all K sub-fields that renders the union of
their samples along each ray in a single volume-rendering pass (float64, gloo)."""
from __future__ import annotations

import pytest
import torch

from distnerf.renderer.occupancy import march_rays
from distnerf.renderer.volume import volume_render
from distnerf.strategy.joint import clip_to_box, region_generator
from tests.conftest import spawn
from tests.dist.joint_workers import BG, joint_worker, region_models
from tests.dist.workers import make_problem


def union_loss(num_regions: int):
    """Reference: every region's samples (its own marching inside its box, the same jitter)
    merged along the ray and rendered in one pass."""
    part, models = region_models(num_regions, list(range(num_regions)))
    rays, target = make_problem(48, seed=3)
    generator = torch.Generator().manual_seed(1234)
    r = len(rays)
    starts, ends, sigmas, rgbs = [], [], [], []
    for k, m in models.items():
        t_in, t_out, hit = clip_to_box(rays, part.boxes[k])
        idx = hit.nonzero().view(-1)
        t0, t1, mask = march_rays(rays.origins[idx], rays.directions[idx], t_in[idx], t_out[idx], m.grid_aabb,
                                  m.step_size(), m.occupancy, True, region_generator(generator, k, "cpu"))
        s = t0.shape[1]
        ts, te = torch.full((r, s), 1e9, dtype=torch.float64), torch.full((r, s), 1e9, dtype=torch.float64)
        ts[idx], te[idx] = torch.where(mask, t0, 1e9), torch.where(mask, t1, 1e9)
        ray_i, samp_i = mask.nonzero(as_tuple=True)
        mid = 0.5 * (t0 + t1)[ray_i, samp_i]
        pts = rays.origins[idx][ray_i] + rays.directions[idx][ray_i] * mid[:, None]
        sig = torch.zeros(r, s, dtype=torch.float64)
        col = torch.zeros(r, s, 3, dtype=torch.float64)
        sig = sig.index_put((idx[ray_i], samp_i), m.field_density(pts))
        col = col.index_put((idx[ray_i], samp_i), m.field_rgb(pts, rays.viewdirs[idx][ray_i]))
        starts.append(ts), ends.append(te), sigmas.append(sig), rgbs.append(col)
    ts, te = torch.cat(starts, 1), torch.cat(ends, 1)
    order = torch.argsort(ts, dim=1)
    take = lambda t: torch.gather(t, 1, order)  # noqa: E731
    sig = take(torch.cat(sigmas, 1))
    col = torch.gather(torch.cat(rgbs, 1), 1, order[..., None].expand(-1, -1, 3))
    ts, te = take(ts), take(te)
    te = torch.where(ts >= 1e9, ts, te)  # padding: zero-length intervals, zero density
    out = volume_render(sig, col, ts, te, BG)
    loss = ((out["rgb"] - target) ** 2).mean(dim=-1).sum() / r
    loss.backward()
    grads = {k: {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None} for k, m in models.items()}
    return loss.detach(), out["rgb"].detach(), grads


@pytest.mark.parametrize("num_regions", [2, 4], ids=["K=2", "K=4 (2 per rank)"])
def test_joint_loss_and_gradients_equal_single_process_union(num_regions, tmp_path):
    spawn(joint_worker, 2, num_regions, str(tmp_path), timeout=240)
    ref_loss, ref_rgb, ref_grads = union_loss(num_regions)
    results = [torch.load(tmp_path / f"rank_{r}.pt", weights_only=False) for r in range(2)]
    assert float(ref_loss) > 1e-3
    seen = set()
    for res in results:
        assert torch.allclose(res["loss"], ref_loss, atol=1e-12, rtol=0)
        assert torch.allclose(res["rgb"], ref_rgb, atol=1e-12, rtol=0)
        for k, grads in res["grads"].items():
            seen.add(k)
            assert grads.keys() == ref_grads[k].keys() and grads
            for n, g in grads.items():
                assert float(ref_grads[k][n].abs().max()) > 0, (k, n)
                assert torch.allclose(g, ref_grads[k][n], atol=1e-12, rtol=1e-9), (k, n)
    assert seen == set(range(num_regions))
