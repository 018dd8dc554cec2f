"""Spatial partition: exact tiling, boundary ownership, ray routing, balanced split."""
from __future__ import annotations

import pytest
import torch

from distnerf.strategy.partition import region_owner
from distnerf.strategy.ss import SHARED_STREAM
from distnerf.strategy.partition import Partition, balanced_partition, grid_partition, weighted_median_split

BOUNDS = torch.tensor([[-2.0, -0.5, -3.0], [2.0, 0.5, 3.0]], dtype=torch.float64)


def volume(boxes):
    return (boxes[:, 1] - boxes[:, 0]).prod(dim=1)


@pytest.mark.parametrize("num", [1, 2, 3, 4, 6, 8])
def test_grid_covers_bounds_exactly_once(num):
    part = grid_partition(BOUNDS, num)
    assert len(part) == num
    assert float(volume(part.boxes).sum()) == pytest.approx(float(volume(BOUNDS[None])[0]), rel=1e-12)
    # every point of the closed box, boundaries and corners included, has exactly one owner
    g = torch.rand(20000, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(num))
    pts = BOUNDS[0] + g * (BOUNDS[1] - BOUNDS[0])
    faces = torch.unique(part.boxes[:, :, None, :].expand(-1, -1, 1, -1).reshape(-1, 3), dim=0)
    pts = torch.cat([pts, faces, BOUNDS])  # region corners and the scene box corners
    member = part.contains(pts)
    assert bool((member.sum(dim=1) == 1).all())
    assert torch.equal(part.region_of(pts), member.to(torch.int8).argmax(dim=1))


def test_grid_splits_ground_plane_of_flat_scene():
    part = grid_partition(BOUNDS, 4)  # y is the short (vertical) axis: a 2 x 2 grid on x, z
    assert torch.all(part.boxes[:, 0, 1] == BOUNDS[0, 1]) and torch.all(part.boxes[:, 1, 1] == BOUNDS[1, 1])
    assert len(torch.unique(part.boxes[:, 0, 0])) == 2 and len(torch.unique(part.boxes[:, 0, 2])) == 2
    with pytest.raises(ValueError, match="product"):
        grid_partition(BOUNDS, 4, counts=[3, 1, 1])


def test_boundary_sample_lands_in_exactly_one_region():
    part = grid_partition(BOUNDS, 2, counts=[2, 1, 1])
    on_plane = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.5, 3.0], [2.0, 0.5, 3.0], [-2.0, -0.5, -3.0]],
                            dtype=torch.float64)
    owners = part.region_of(on_plane)
    assert owners.tolist() == [1, 1, 1, 0]  # half-open [lo, hi): the plane x = 0 belongs to the upper region
    # points outside the scene box are clamped to it
    assert part.region_of(torch.tensor([[-9.0, 0.0, 0.0], [9.0, 9.0, 9.0]], dtype=torch.float64)).tolist() == [0, 1]


def test_enlarged_boxes_overlap_and_stay_inside_bounds():
    part = grid_partition(BOUNDS, 2, counts=[2, 1, 1], overlap=0.15)
    big = part.enlarged()
    assert float(big[0, 1, 0]) == pytest.approx(0.0 + 0.15 * 2.0)  # region 0 spans x in [-2, 0]
    assert float(big[1, 0, 0]) == pytest.approx(0.0 - 0.15 * 2.0)
    assert torch.all(big[:, 0] >= BOUNDS[0]) and torch.all(big[:, 1] <= BOUNDS[1])
    pts = torch.tensor([[0.1, 0.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    assert part.contains(pts, enlarged=True).tolist() == [[True, True], [False, True]]


def test_ray_crossing_several_regions_is_routed_to_each():
    part = grid_partition(BOUNDS, 4, counts=[4, 1, 1])  # slabs x in [-2,-1], [-1,0], [0,1], [1,2]
    origins = torch.tensor([[-3.0, 0.0, 0.0], [-3.0, 0.0, 0.0], [0.5, 0.0, -9.0], [0.5, 5.0, 0.0]],
                           dtype=torch.float64)
    directions = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]],
                              dtype=torch.float64)
    near = torch.tensor([0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    far = torch.tensor([10.0, 2.5, 20.0, 10.0], dtype=torch.float64)
    crossing = part.ray_crossings(origins, directions, near, far, enlarged=False)
    assert crossing.tolist() == [[True, True, True, True],      # crosses the whole box along x
                                 [True, True, False, False],    # stops at x = -0.5 (far)
                                 [False, False, True, False],   # along z inside one slab
                                 [False, False, False, False]]  # starts above the box, goes up: misses all


def test_balanced_split_equalises_content():
    g = torch.Generator().manual_seed(0)
    # content concentrated near x = 1.5: a grid split would give one region almost everything
    pts = torch.cat([torch.rand(4000, 3, generator=g, dtype=torch.float64) * 0.4 + torch.tensor([1.3, -0.2, 1.3]),
                     BOUNDS[0] + torch.rand(1000, 3, generator=g, dtype=torch.float64) * (BOUNDS[1] - BOUNDS[0])])
    weights = torch.ones(len(pts), dtype=torch.float64)
    part = balanced_partition(BOUNDS, 4, pts, weights, overlap=0.1)
    share = torch.bincount(part.region_of(pts), minlength=4).double() / len(pts)
    assert torch.all((share - 0.25).abs() < 0.03), share
    assert float(volume(part.boxes).sum()) == pytest.approx(float(volume(BOUNDS[None])[0]), rel=1e-12)
    grid_share = torch.bincount(grid_partition(BOUNDS, 4).region_of(pts), minlength=4).double() / len(pts)
    assert float(grid_share.max()) > 0.5  # the grid is unbalanced on this content


def test_weighted_median():
    pos = torch.tensor([0.0, 1.0, 2.0, 3.0])
    assert weighted_median_split(pos, torch.tensor([1.0, 1.0, 1.0, 1.0]), 0.5) == 1.0
    assert weighted_median_split(pos, torch.tensor([0.0, 0.0, 0.0, 5.0]), 0.5) == 3.0


def test_partition_round_trip(tmp_path):
    part = grid_partition(BOUNDS, 3, overlap=0.2)
    part.save(tmp_path / "partition.json")
    again = Partition.load(tmp_path / "partition.json")
    assert torch.equal(again.boxes, part.boxes) and again.overlap == 0.2 and again.kind == "grid"
    (tmp_path / "bad.json").write_text('{"boxes": []}')
    with pytest.raises(ValueError, match="bad.json"):
        Partition.load(tmp_path / "bad.json")


def test_region_owner_blocks():
    assert region_owner(4, 2) == [0, 0, 1, 1]
    assert region_owner(2, 2) == [0, 1]
    with pytest.raises(ValueError, match="multiple of the world size"):
        region_owner(3, 2)


def test_assign_regions_balances_hand_computed_costs():
    from distnerf.strategy.partition import assign_regions

    assert assign_regions([1.0, 1.0, 1.0, 1.0], 2) == [0, 0, 1, 1]  # equal costs: the contiguous blocks
    assert assign_regions([5.0, 4.0, 3.0, 3.0, 3.0, 2.0], 2) == [0, 1, 0, 1, 1, 0]  # 10 | 10
    assert assign_regions([5.0, 4.0, 3.0, 3.0, 3.0, 2.0], 3) == [0, 1, 1, 2, 2, 0]  # 7 | 7 | 6
    assert assign_regions([9.0, 9.0, 1.0, 1.0], 2) == [0, 1, 0, 1]  # not the blocks [0, 0, 1, 1] (18 | 2)
    costs = [float((7 * k) % 11) for k in range(16)]  # beyond the exact search: greedy, K / W each
    owner = assign_regions(costs, 4, exact_max_regions=8)
    loads = [sum(c for c, r in zip(costs, owner) if r == rank) for rank in range(4)]
    assert [owner.count(r) for r in range(4)] == [4, 4, 4, 4] and max(loads) - min(loads) <= max(costs)
    with pytest.raises(ValueError, match="multiple"):
        assign_regions([1.0, 1.0, 1.0], 2)


def test_region_load_and_empty_region_refused():
    from distnerf.strategy.partition import empty_region_error, region_load

    part = grid_partition(torch.tensor([[0.0, 0.0, 0.0], [4.0, 1.0, 1.0]]), 2, counts=[2, 1, 1])  # x < 2 | x >= 2
    # three rays along +x through the lower half only (x from 0 to 1), one through both halves
    origins = torch.tensor([[-1.0, 0.5, 0.5], [-1.0, 0.5, 0.5], [-1.0, 0.2, 0.2], [-1.0, 0.5, 0.5]])
    directions = torch.tensor([[1.0, 0.0, 0.0]] * 4)
    near, far = torch.zeros(4), torch.tensor([2.0, 2.0, 2.0, 6.0])
    images = torch.tensor([0, 0, 1, 2])
    st = region_load(part, origins, directions, near, far, images)
    assert st["rays"] == [4, 1] and st["cameras"] == [3, 1]
    assert st["cost"] == pytest.approx([1.0 + 1.0 + 1.0 + 2.0, 2.0])  # marched length inside each box
    whole = region_load(part, origins, directions, near, far, images, marched=part.bounds)
    assert whole["cost"] == pytest.approx([1.0 + 1.0 + 1.0 + 4.0, 4.0])  # the whole ray inside the scene box
    st = region_load(part, origins[:3], directions[:3], near[:3], far[:3], images[:3])
    assert st["rays"] == [3, 0]
    err = empty_region_error(1, part.boxes[1].tolist(), 3)
    assert "region 1" in str(err) and "strategy.num_regions" in str(err) and "dataset.aabb" in str(err)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_ss_batch_per_rank_joint_and_independent(world_size):
    """What ``train.rays_per_rank`` = r means under ``ss`` (global batch B = W x r): joint, every rank
    draws the same B rays (one shared stream) and renders its regions' segments of them; independent,
    each region draws B / K from its own stream, so a rank of K / W regions draws r."""
    from distnerf.distributed.env import DistEnv
    from distnerf.strategy.ss import SSStrategy

    r, num = 1024, 2 * world_size
    batch = world_size * r
    for training in ("joint", "independent"):
        for rank in range(world_size):
            ss = SSStrategy({"training": training}, DistEnv(rank=rank, world_size=world_size))
            ss.partition, ss.owner = grid_partition(BOUNDS, num), region_owner(num, world_size)
            assert len(ss.my_regions) == 2
            assert ss.rays_per_rank(batch) == (batch if training == "joint" else r), (training, rank)
            sampling = ss.sampling(None, batch)
            assert sampling.rays == ss.rays_per_rank(batch)
            if training == "joint":
                assert sampling.description.startswith(f"{batch} rays drawn once (one shared stream, {r} per rank)")
                assert sampling.stream == SHARED_STREAM and sampling.ray_filter is None
            else:
                assert f"x {batch // num} rays drawn from each region's own stream" in sampling.description
                assert sampling.stream == tuple(ss.my_regions) and len(sampling.ray_filter) == 2


def test_ss_independent_batch_not_divisible_by_the_regions_is_refused():
    from distnerf.distributed.env import DistEnv
    from distnerf.strategy.ss import SSStrategy

    ss = SSStrategy({"training": "independent"}, DistEnv(rank=0, world_size=1))
    ss.partition, ss.owner = grid_partition(BOUNDS, 3), region_owner(3, 1)
    with pytest.raises(ValueError, match=r"the global batch of 4096 rays .* is not divisible by the 3 regions"):
        ss.rays_per_rank(4096)
    assert ss.rays_per_rank(3 * 1000) == 3000  # one rank holding all 3 regions: 1000 from each
