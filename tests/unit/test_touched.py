"""The touched-vertex share (:mod:`distnerf.study.touched`) of a joint ``ss`` container against ONE model.

The sharded joint model renders exactly the one model's samples (``tests/unit/test_ss_sharded.py``), each
region its owned intervals with weights local to its segment; the module turns them into the whole ray's
weights with the transmittance in front. So the shards' touched rows, placed on the one model's lattice,
must be the one model's touched rows (the one model's path has no segments, no compositing of
transmittances): an independent check of that step. A shard's copy of a face vertex is touched only by its
own side's samples, so the comparison is of the union; and every touched row of a shard is touched in the
one model. Taking a region's local weights for the ray's (no transmittance in front) fails this test.
"""
from __future__ import annotations

import pytest
import torch

from distnerf.study.touched import mark_touched
from tests import sharded_case as case


def touched_rows(renderer, models, threshold: float) -> list[torch.Tensor]:
    touched = [torch.zeros(m.density.shape[0], dtype=torch.bool) for m in models]
    for seed in range(3):
        rays = case.aerial_rays(256, 50 + seed, case.NUM_IMAGES)
        jitter = torch.rand(len(rays), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        mark_touched(renderer, rays, jitter, threshold, touched)
    return touched


@pytest.mark.parametrize("contraction,num_regions", [("mipnerf360", 2), ("none", 4)])
def test_shards_touch_the_one_models_vertices(contraction, num_regions):
    single = case.one_model(contraction, num_regions)
    joint = case.sharded(single, contraction, num_regions)
    [ref] = touched_rows(single, [single], 1e-4)
    shards = touched_rows(joint, joint.models, 1e-4)
    lattice = single.shape
    union = torch.zeros(lattice, dtype=torch.bool)
    for m, t in zip(joint.models, shards):
        (_, first), shape = m.lattice, m.shape
        window = tuple(slice(f, f + n) for f, n in zip(first, shape))
        assert not (t.view(shape) & ~ref.view(lattice)[window]).any(), "a shard touched a row the one model did not"
        union[window] |= t.view(shape)
    assert torch.equal(union.view(-1), ref)
    share = float(ref.double().mean())
    assert 0.05 < share < 0.95, share  # the threshold leaves some rows out and takes some in
    every = touched_rows(single, [single], -1.0)[0]  # every marched sample: more rows than the weighty ones
    assert int(every.sum()) > int(ref.sum())
