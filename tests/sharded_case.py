"""The sharded joint model of ``strategy=ss`` against ONE model: the problem both the one-process test
(``tests/unit/test_ss_sharded.py``) and the two-rank gloo test (``tests/dist/test_ss_sharded.py``) train.

One :class:`~distnerf.model.grid.GridModel` (float64) with random tables, an opaque floor, an ``affine``
appearance, colour and termination thresholds 0 and no regulariser, on the lattice the partition needs
(``model.lattice_multiple``). The regions' shards are built by the strategy's own builder
(:meth:`~distnerf.strategy.ss.SSStrategy.build_region_model`, ``joint_model=sharded``) and take the one
model's tables sliced on its lattice (:attr:`~distnerf.model.grid.GridModel.lattice`); the container
(:class:`~distnerf.strategy.regions.JointRegionModels`) takes a copy of its appearance table. Both are then
trained alike (Adam, the same rays and jitter each step) across occupancy refreshes and an upsampling.
"""
from __future__ import annotations

import torch

from distnerf.data.rays import RayBundle
from distnerf.distributed import DistEnv
from distnerf.model.grid import GridModel
from distnerf.strategy.partition import grid_partition
from distnerf.strategy.regions import JointRegionModels
from distnerf.strategy.ss import SSStrategy, shard_layout

AABB = torch.tensor([[-4.0, 0.0, -4.0], [4.0, 2.0, 4.0]])  # y up, flat: cubic voxels spread over x and z
BG = torch.tensor([0.25, 0.5, 0.875])
FLOOR = 0.5  # inside the box: the floor ends rays in every region
NUM_IMAGES = 5
COUNTS = {2: [2, 1, 1], 4: [2, 1, 2]}  # regions cut through the box's centre planes
UPSAMPLE_STEP = 10  # of 20: refreshes at 8, 10 (the upsampling's) and 16


def model_cfg(contraction: str, counts: list[int]) -> dict:
    return {"name": "grid", "resolutions": [13, 21], "upsample_steps": [UPSAMPLE_STEP], "color": "sh",
            "contraction": contraction, "min_altitude": FLOOR, "opaque_floor": True, "appearance": "affine",
            "tv_weight": 0.0, "color_threshold": 0.0, "termination": 0.0, "cubic_voxels": True,
            "tighten_aabb": False, "sparse_grad": False, "occupancy_every": 8, "occupancy_threshold": 0.05,
            "lattice_multiple": counts}


def one_model(contraction: str, num_regions: int, seed: int = 0) -> GridModel:
    """The one model, random: density low in about 60% of 2 x 2 x 2-vertex blocks (empty cells), random
    features and appearance codes near the identity."""
    torch.manual_seed(seed)
    m = GridModel(AABB, BG, model_cfg(contraction, COUNTS[num_regions]), num_images=NUM_IMAGES).double()
    with torch.no_grad():
        shape = m.shape
        blocks = torch.rand(*(-(-n // 2) for n in shape)) < 0.6
        empty = blocks.repeat_interleave(2, 0).repeat_interleave(2, 1).repeat_interleave(2, 2)
        empty = empty[:shape[0], :shape[1], :shape[2]].reshape(-1)
        # softplus(raw + shift) about 0.1 to 1 voxel^-1: a step of half a voxel is 5-40% opaque
        m.density.copy_(torch.randn_like(m.density) - 1.0 - m.density_shift)
        m.density[empty] = -15.0 - m.density_shift
        m.features.copy_(torch.randn_like(m.features))
        m.appearance.table.add_(torch.randn_like(m.appearance.table) * 0.1)
    m.update_occupancy()
    return m


def partition(contraction: str, num_regions: int):
    part = grid_partition(AABB.double(), num_regions, COUNTS[num_regions], overlap=0.0)
    part.unbounded = contraction == "mipnerf360"
    part.world_size = 1
    return part


def sharded(single: GridModel, contraction: str, num_regions: int, env: DistEnv | None = None,
            regions: list[int] | None = None) -> JointRegionModels:
    """The container of ``regions`` (default all) built by the strategy, the one model's tables sliced in."""
    env = env or DistEnv(rank=0, world_size=1)
    strategy = SSStrategy({"training": "joint", "joint_model": "sharded"}, env)
    strategy.partition = partition(contraction, num_regions)
    cfg = model_cfg(contraction, COUNTS[num_regions])
    models = {}
    for k in (range(num_regions) if regions is None else regions):
        shard = strategy.build_region_model(cfg, AABB, BG, k, NUM_IMAGES).double()
        assert shard.shard is not None and shard.step_size() == single.step_size()
        load_slice(shard, single)
        models[k] = shard
    joint = JointRegionModels(models, strategy.partition, BG.double(), env,
                              appearance=strategy.shared_appearance(cfg, NUM_IMAGES).double())
    with torch.no_grad():
        joint.appearance.table.copy_(single.appearance.table)
    for m in joint.models:
        m.update_occupancy()
    joint.merge_occupancy()
    return joint


def table_slice(shard: GridModel, table: torch.Tensor) -> torch.Tensor:
    """The rows of ``table`` (a (V, C) table of the one model on the whole lattice) that ``shard`` holds."""
    (lattice, first), shape = shard.lattice, shard.shape
    grid = table.view(*lattice, -1)
    return grid[tuple(slice(f, f + n) for f, n in zip(first, shape))].reshape(-1, table.shape[1])


@torch.no_grad()
def load_slice(shard: GridModel, single: GridModel) -> None:
    assert single.shape == shard.lattice[0], (single.shape, shard.lattice)
    shard.density.copy_(table_slice(shard, single.density))
    shard.features.copy_(table_slice(shard, single.features))


def aerial_rays(n: int, seed: int, num_images: int | None = None) -> RayBundle:
    """Rays from above :data:`AABB` (most go down and reach the floor, some beyond the box's edge, in the
    outer regions of an unbounded partition; a few go up), each of a training image in [0, num_images) when
    given."""
    g = torch.Generator().manual_seed(seed)
    o = torch.cat([(torch.rand(n, 1, generator=g, dtype=torch.float64) - 0.5) * 6,
                   torch.full((n, 1), 3.0, dtype=torch.float64),
                   (torch.rand(n, 1, generator=g, dtype=torch.float64) - 0.5) * 6], dim=1)
    d = torch.randn(n, 3, generator=g, dtype=torch.float64)
    d[:, 1] = -d[:, 1].abs() * 0.8
    d[: n // 8, 1] *= -1  # going up: the background
    d = d / d.norm(dim=-1, keepdim=True)
    ids = None if num_images is None else torch.randint(num_images, (n,), generator=g)
    return RayBundle(o, d, d.clone(), torch.full((n,), 0.1, dtype=torch.float64),
                     torch.full((n,), 40.0, dtype=torch.float64), ids)


def step_both(single: GridModel, joint: JointRegionModels, step: int, num_rays: int = 192) -> dict:
    """Forward and backward of one step on both (the same rays and jitter); the face copies' gradients summed.

    Returns:
        ``rgb``: (one model's, the composite) (R, 3); ``loss``: (both); ``floored``: share of rays the floor ends.
    """
    rays = aerial_rays(num_rays, 100 + step, NUM_IMAGES)
    target = torch.rand(num_rays, 3, generator=torch.Generator().manual_seed(200 + step), dtype=torch.float64)
    for m in (single, joint):
        m.train()
        for p in m.parameters():
            p.grad = None
    ref = single(rays, torch.Generator().manual_seed(300 + step))
    out = joint(rays, torch.Generator().manual_seed(300 + step))
    losses = []
    for o in (ref, out):
        loss = ((o.rgb - target) ** 2).mean()
        loss.backward()
        losses.append(loss.detach())
    joint.tie_faces()
    far = single.ray_far(rays)
    floored = float((far < single.ray_far_without_floor(rays)).double().mean())
    return {"rgb": (ref.rgb.detach(), out.rgb.detach()), "loss": losses, "floored": floored}


def largest_differences(single: GridModel, joint: JointRegionModels, result: dict) -> dict:
    """Largest absolute colour difference and largest relative gradient difference (each shard's rows, face
    copies holding their summed gradient, against the one model's rows; the appearance table)."""
    a, b = result["rgb"]
    out = {"rgb_abs": float((a - b).abs().max()), "loss_abs": float((result["loss"][0] - result["loss"][1]).abs())}
    rel = 0.0
    for shard in joint.models:
        for name in ("density", "features"):
            want = table_slice(shard, getattr(single, name).grad)
            got = getattr(shard, name).grad
            rel = max(rel, float((got - want).abs().max() / want.abs().max().clamp(min=1e-300)))
    if joint.appearance is not None:
        want = single.appearance.table.grad
        rel = max(rel, float((joint.appearance.table.grad - want).abs().max() / want.abs().max()))
    out["grad_rel"] = rel
    return out


def train_both(single: GridModel, joint: JointRegionModels, steps: int, lr: float = 0.05):
    """``steps`` Adam steps of both (rebuilt at the upsampling, which replaces the tables); each step's
    update_state after the optimizer, as the trainer's. Returns the last step's :func:`step_both` result."""
    def adams():
        return (torch.optim.Adam(single.parameters(), lr=lr), torch.optim.Adam(joint.parameters(), lr=lr))

    opts, result = adams(), None
    for step in range(steps):
        result = step_both(single, joint, step)
        for o in opts:
            o.step()
        replaced = single.update_state(step + 1)
        assert joint.update_state(step + 1) == replaced
        if replaced:
            opts = adams()
    return result


def check_layout(contraction: str, num_regions: int) -> None:
    """The shards tile the one model's lattice (face planes in two shards each) and hold its occupancy."""
    boxes, multiple = shard_layout(partition(contraction, num_regions))
    assert list(multiple) == COUNTS[num_regions] and len(boxes) == num_regions


def or_across_ranks(env: DistEnv) -> dict:
    """:func:`~distnerf.distributed.all_reduce_or` on this group against the all-reduce (max) it replaced and the
    OR worked out here from every rank's flags (rank r sets every (r + 2)-th of 5 x 6 x 7 = 210 flags, not a multiple
    of 8, and flag 209 on the last rank: the padding bits): whether each is equal, bit for bit."""
    from distnerf import distributed as D

    def flags_of(r: int) -> torch.Tensor:
        f = torch.arange(210) % (r + 2) == 0
        f[209] = r == env.world_size - 1
        return f.view(5, 6, 7)

    want = torch.stack([flags_of(r) for r in range(env.world_size)]).any(dim=0)
    got = D.all_reduce_or(env, flags_of(env.rank))
    old = flags_of(env.rank).to(torch.uint8)
    D.all_reduce_(old, "max")
    return {"by_hand": bool(got.dtype == torch.bool and torch.equal(got, want)), "max": bool(torch.equal(got, old > 0)),
            "flag_209": bool(got[4, 5, 6])}


def sharded_worker(rank: int, world_size: int, port: int, contraction: str, num_regions: int, out_dir: str) -> None:
    """A rank of the two-rank case: its regions' shards (contiguous blocks), the one model (the same on every
    rank), step 0 and 20 steps; writes ``rank_R.json`` with :func:`largest_differences` of both (or the error)."""
    import json
    import traceback
    from pathlib import Path

    import torch.distributed as dist

    from distnerf.strategy.partition import region_owner
    from tests.dist.workers import set_env

    try:
        set_env(rank, world_size, port)
        dist.init_process_group("gloo")
        env = DistEnv(rank=rank, world_size=world_size, backend="gloo")
        or_checks = or_across_ranks(env)
        mine = [k for k, r in enumerate(region_owner(num_regions, world_size)) if r == rank]
        single = one_model(contraction, num_regions)
        joint = sharded(single, contraction, num_regions, env, mine)
        occupancy_equal = bool(torch.equal(joint.models[0].occupancy.binary, single.occupancy.binary))
        first = largest_differences(single, joint, step_both(single, joint, 0))
        single, joint = one_model(contraction, num_regions), None
        joint = sharded(single, contraction, num_regions, env, mine)
        cells = [joint.models[0].occupancy_evidence[0].numel()]  # each merge's M^3: the one in sharded(), then
        merge = joint.merge_occupancy

        def counted_merge():
            cells.append(joint.models[0].occupancy_evidence[0].numel())
            merge()

        joint.merge_occupancy = counted_merge  # ... the refreshes' (update_state calls it)
        last = largest_differences(single, joint, train_both(single, joint, 20))
        result = {"regions": mine, "step0": first, "step20": last, "occupancy_equal": occupancy_equal,
                  "occupancy_equal_20": bool(torch.equal(joint.models[0].occupancy.binary, single.occupancy.binary)),
                  "face_bytes": joint.exchange.get("face_bytes", 0),
                  "occupancy_bytes": joint.exchange.get("occupancy_bytes", 0), "occupancy_cells": cells,
                  "or_checks": or_checks}
    except Exception:  # noqa: BLE001 (reported to the test)
        result = {"error": traceback.format_exc()}
    Path(out_dir, f"rank_{rank}.json").write_text(json.dumps(result))
    if dist.is_initialized():
        dist.destroy_process_group()
