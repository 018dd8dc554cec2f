"""The fixed-size paths a CUDA run takes instead of reading a size (issue 26 item 8), run on the CPU
inside ``sync_free_paths()`` against the paths that read the size: the same values and gradients
(a ``ss`` sub-model's focus/context split; a region's rays selected or masked), and no host sync
left where they replaced one (counted by :class:`~distnerf.observe.syncs.SyncCounter`)."""
from __future__ import annotations

import pytest
import torch

from distnerf.components.loss import photometric_sse
from distnerf.data.rays import RayBundle
from distnerf.host_buffers import sync_free, sync_free_paths
from distnerf.model.grid import GridModel
from distnerf.observe.syncs import SyncCounter
from distnerf.strategy.partition import grid_partition
from distnerf.strategy.regions import RegionModels

AABB = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])
BG = torch.ones(3)


@pytest.mark.cuda
def test_the_switch_is_cuda_or_the_context():
    assert not sync_free("cpu") and sync_free("cuda")
    with sync_free_paths():
        assert sync_free("cpu")
        with sync_free_paths(False):
            assert not sync_free("cpu")
        assert sync_free("cpu")
    assert not sync_free("cpu")


def _focus_model(seed: int = 0) -> GridModel:
    torch.manual_seed(seed)
    box = torch.tensor([[-0.5, -1.0, -1.0], [0.6, 1.0, 1.0]])
    m = GridModel(AABB, BG, resolutions=[10], upsample_steps=[], color="mlp", hidden_width=8,
                  focus_aabb=box, context_resolution=5).double()
    with torch.no_grad():
        for t in (m.density, m.context_density, m.features, m.context_features):
            t.copy_(torch.randn_like(t))
    return m


def test_focus_split_without_a_size_gives_the_same_values_and_gradients():
    points = (torch.rand(500, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64) - 0.5) * 2.2
    results = []
    for free in (False, True):
        m = _focus_model()
        m.sparse_grad = False  # the split path's sparse rows would hold the same values; compare dense
        with sync_free_paths(free), SyncCounter() as syncs:
            value = m.raw_density(points).sum() + m.point_features(points).square().sum()
        value.backward()
        results.append((value.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None},
                        syncs.by_location()))
    (v0, g0, s0), (v1, g1, s1) = results
    torch.testing.assert_close(v1, v0, rtol=1e-12, atol=1e-12)
    assert set(g0) == set(g1) and {"density", "features", "context_density", "context_features"} <= set(g0)
    for name in g0:
        assert g0[name].abs().sum() > 0, name
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-10, atol=1e-12, msg=name)
    assert any("_split" in k for k in s0) and not any("_split" in k for k in s1), (s0, s1)


def test_sync_free_colour_rows_stay_dense():
    m = _focus_model()  # sparse_grad on: sparse rows where the size is free, dense where it is not
    points = torch.rand(50, 3, dtype=torch.float64) - 0.5
    m.point_features(points).sum().backward()
    assert m.features.grad.is_sparse
    m.zero_grad(set_to_none=True)
    with sync_free_paths():
        m.point_features(points).sum().backward()
    assert not m.features.grad.is_sparse


def test_a_region_renders_masked_rays_to_the_same_loss_and_gradients_as_selected_ones():
    part = grid_partition(AABB, 2, [2, 1, 1], overlap=0.0)
    g = torch.Generator().manual_seed(3)
    n = 48  # two blocks of 24: rays along z at random x, some missing their block's region
    o = torch.cat([(torch.rand(n, 2, generator=g) - 0.5) * 2.4, torch.full((n, 1), -3.0)], dim=1)
    d = torch.tensor([[0.0, 0.0, 1.0]]).expand(n, 3).clone()
    rays = RayBundle(o, d, d.clone(), torch.zeros(n), torch.full((n,), 6.0))
    target = torch.rand(n, 3, generator=g)
    valid = torch.ones(n, dtype=torch.bool)
    results = []
    for free in (False, True):
        torch.manual_seed(0)
        subs = {k: GridModel(AABB, BG, resolutions=[8], upsample_steps=[], color="sh",
                             focus_aabb=part.enlarged()[k].float(), context_resolution=4) for k in range(2)}
        for m in subs.values():
            m.sparse_grad = False
            with torch.no_grad():
                m.density.normal_(0.0, 2.0)
                m.features.normal_()
        models = RegionModels(subs, part, blocks=True).eval()  # eval: no jitter, so both paths place the same samples
        with sync_free_paths(free), SyncCounter() as syncs:
            out = models(rays)
        sse = photometric_sse(out, target, valid)
        sse.backward()
        results.append((sse.detach(), {n_: p.grad.clone() for n_, p in models.named_parameters() if p.grad is not None},
                        syncs.by_location(), out["ray_index"].numel()))
    (l0, g0, s0, rows0), (l1, g1, s1, rows1) = results
    assert rows1 == n and rows0 < n  # the masked path renders every ray of both blocks, the selected one fewer
    torch.testing.assert_close(l1, l0, rtol=1e-6, atol=1e-7)
    assert set(g0) == set(g1)
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-5, atol=1e-6, msg=name)
    assert any("regions.py" in k for k in s0) and not any("regions.py" in k for k in s1), (s0, s1)


def test_a_contracted_region_samples_no_masked_ray():
    """Contracted sub-models ignore ``far``; a masked ray's empty segment (far = near) must still
    place no sample (else every ray of the block is marched to the sky for a zero weight)."""
    import dataclasses

    part = dataclasses.replace(grid_partition(AABB, 2, [2, 1, 1], overlap=0.0), unbounded=True)
    g = torch.Generator().manual_seed(3)
    n = 48
    o = torch.cat([(torch.rand(n, 1, generator=g) - 0.5) * 6, torch.full((n, 1), 2.5),
                   (torch.rand(n, 1, generator=g) - 0.5) * 6], dim=1)
    d = torch.nn.functional.normalize(torch.randn(n, 3, generator=g) * torch.tensor([1.0, 0.0, 1.0])
                                      + torch.tensor([0.0, -1.0, 0.0]), dim=-1)
    rays = RayBundle(o, d, d.clone(), torch.full((n,), 0.05), torch.full((n,), 8.0))
    counts = []
    for free in (False, True):
        torch.manual_seed(0)
        subs = {k: GridModel(part.enlarged()[k].float(), BG, resolutions=[8], upsample_steps=[], color="sh",
                             contraction="mipnerf360") for k in range(2)}
        models = RegionModels(subs, part, blocks=True).eval()
        with sync_free_paths(free):
            out = models(rays)
        counts.append((out.num_samples, out["ray_index"].numel()))
    (s0, rows0), (s1, rows1) = counts
    assert rows0 < rows1 == n  # some rays miss their block's region
    assert s1 == s0
