"""``strategy=ss`` joint training as one model sharded (``strategy.joint_model=sharded``): K shards built by
the strategy, holding one model's random tables sliced on its lattice, render and train exactly as that
model (float64: colours to 1e-9 absolute, gradients to 1e-9 relative, a face vertex's copies compared as
their summed gradient), at step 0 and after 20 steps across occupancy refreshes and an upsampling;
bounded and contracted scenes, K = 2 and K = 4 (2 x 2 through the centre), opaque floor and one affine
appearance on the composite. The problem: ``tests/sharded_case.py``; two ranks: ``tests/dist/test_ss_sharded.py``.
"""
from __future__ import annotations

import pytest
import torch

from distnerf.strategy.partition import balanced_partition, grid_partition
from distnerf.strategy.ss import shard_layout
from tests import sharded_case as case

TOL_RGB, TOL_GRAD = 1e-9, 1e-9


@pytest.mark.parametrize("contraction", ["none", "mipnerf360"])
@pytest.mark.parametrize("num_regions", [2, 4])
def test_shards_render_and_train_as_the_one_model(contraction, num_regions):
    single = case.one_model(contraction, num_regions)
    joint = case.sharded(single, contraction, num_regions)
    occ = single.occupancy.binary
    assert torch.equal(joint.models[0].occupancy.binary, occ)  # the merged grid is the one model's
    assert float((~occ).double().mean()) >= 0.3, "at least 30% of the occupancy cells empty"
    # the shards hold the lattice once, but for the face planes (in two shards each)
    lattice = single.shape
    faces = sum(1 for a, c in enumerate(case.COUNTS[num_regions]) if c > 1 for _ in range(c - 1))
    assert sum(m.density.shape[0] for m in joint.models) > single.density.shape[0] >= \
        sum(m.density.shape[0] for m in joint.models) - faces * 2 * max(lattice) ** 2

    first = case.step_both(single, joint, 0)
    assert 0.5 < first["floored"] < 0.97  # the floor decides many pixels
    d0 = case.largest_differences(single, joint, first)
    assert d0["rgb_abs"] < TOL_RGB and d0["loss_abs"] < 1e-12 and d0["grad_rel"] < TOL_GRAD, d0
    grads = [m.density.grad for m in joint.models]
    assert all(float(g.abs().max()) > 1e-6 for g in grads)  # every shard is trained by the step
    # the face copies are tied: without the sum, a copy holds only its own side's share
    assert joint.appearance is not None and float(joint.appearance.table.grad.abs().max()) > 1e-6

    # 20 steps: refreshes at 8 and 16, the upsampling at 10 (its refresh merged too)
    last = case.train_both(single, joint, 20)
    assert single.resolution == 21 and all(m.resolution == 21 for m in joint.models)
    d20 = case.largest_differences(single, joint, last)
    assert d20["rgb_abs"] < TOL_RGB and d20["grad_rel"] < TOL_GRAD, d20
    assert torch.equal(joint.models[-1].occupancy.binary, single.occupancy.binary)
    for m in joint.models:  # the tables stayed the one model's slices (face copies equal)
        assert torch.allclose(m.features, case.table_slice(m, single.features), atol=1e-9, rtol=0)


def test_untied_face_copies_differ_from_the_one_model():
    """The check above can fail: a face copy alone holds only its own side's gradient."""
    single = case.one_model("mipnerf360", 2)
    joint = case.sharded(single, "mipnerf360", 2)
    joint.tie_faces = lambda: None  # noqa: E731 (what an untied sharding would do)
    result = case.step_both(single, joint, 0)
    assert case.largest_differences(single, joint, result)["grad_rel"] > 1e-3


def test_off_centre_cuts_are_refused_when_contracted():
    part = grid_partition(case.AABB.double(), 3, [3, 1, 1])
    part.unbounded = True
    with pytest.raises(ValueError, match="centre planes"):
        shard_layout(part)
    part.unbounded = False  # a bounded regular grid is a lattice's slices
    assert shard_layout(part)[1] == (3, 1, 1)
    pts = torch.rand(500, 3, dtype=torch.float64) * 8 - 4
    skewed = balanced_partition(case.AABB.double(), 2, pts, torch.rand(500, dtype=torch.float64) ** 4, 0.0)
    if not torch.allclose(skewed.boxes[0, 1], case.AABB.double()[1]):  # a weighted median off the centre
        with pytest.raises(ValueError, match="joint_model=per_region"):
            shard_layout(skewed)


def test_checkpoint_keeps_the_one_appearance_and_its_optimizer_state(tmp_path):
    """The sharded model's shared appearance and its Adam state go with region 0's file only (every rank reads it
    on load); a fresh container loads the tables and the appearance, and the merged optimizer state is the saved
    one, group by group."""
    from distnerf import checkpoint as ckpt
    from distnerf.distributed import DistEnv
    from distnerf.strategy.ss import SSStrategy

    single = case.one_model("mipnerf360", 2)
    joint = case.sharded(single, "mipnerf360", 2)
    opt = torch.optim.Adam([{**g} for g in joint.param_groups(0.01)])
    for step in range(3):
        case.step_both(single, joint, step)
        opt.step()
    strategy = SSStrategy({"training": "joint", "joint_model": "sharded"}, DistEnv(rank=0, world_size=1))
    strategy.partition = case.partition("mipnerf360", 2)
    strategy.owner = [0, 0]
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    strategy.save_model_state(ckpt_dir, joint, opt, {"step": 3, "train_seconds": 1.0})
    ckpt.write_manifest(ckpt_dir, 3, 1, {}, strategy.manifest_extra())
    assert "shared" in ckpt.load_file(ckpt_dir / ckpt.region_file(0)) and \
        "shared" not in ckpt.load_file(ckpt_dir / ckpt.region_file(1))

    fresh = case.sharded(case.one_model("mipnerf360", 2, seed=5), "mipnerf360", 2)
    with torch.no_grad():
        fresh.appearance.table.zero_()
    loaded = strategy.load_model_state(ckpt_dir, fresh)
    assert torch.equal(fresh.appearance.table, joint.appearance.table)
    for a, b in zip(fresh.models, joint.models):
        assert torch.equal(a.density, b.density) and torch.equal(a.features, b.features)
    saved = opt.state_dict()
    assert [g["name"] for g in loaded["optimizer"]["param_groups"]] == [g["name"] for g in saved["param_groups"]]
    shared = len(saved["state"]) - 1  # the appearance table: the last parameter
    assert torch.equal(loaded["optimizer"]["state"][shared]["exp_avg"], saved["state"][shared]["exp_avg"])
    assert float(saved["state"][shared]["exp_avg"].abs().max()) > 0
