"""GPU-path checks that the CPU suite can make (issue 26, items 1-3): version-dependent APIs chosen
by signature with their fallbacks exercised, the rank's own CUDA generator state on resume, and
more local ranks than visible GPUs refused at start."""
from __future__ import annotations

import inspect

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from distnerf import distributed as D


class OlderDDP:
    """A DistributedDataParallel as torch < 2.13 declares it: no ``forward_sync_buffers``."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True,
                 process_group=None, bucket_cap_mb=None, find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False):
        pass


def test_the_ddp_buffer_keyword_follows_the_installed_signature():
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        assert D.ddp_buffer_kwargs(DistributedDataParallel) == {"forward_sync_buffers": False}
    else:
        assert D.ddp_buffer_kwargs(DistributedDataParallel) == {"broadcast_buffers": False}
    older = D.ddp_buffer_kwargs(OlderDDP)
    assert older == {"broadcast_buffers": False}
    OlderDDP(torch.nn.Linear(1, 1), **older)  # the fallback is a keyword the older class takes


def test_accepts_reads_signatures_not_versions():
    def f(a, *, fused=False):
        return a

    assert D.accepts(f, "fused") and not D.accepts(f, "device_id")
    assert not D.accepts(object(), "anything")  # no signature to read: False, never an error
    assert D.accepts(torch.optim.Adam.__init__, "fused")


def test_the_optimizer_is_built_without_fused_where_adam_lacks_it(monkeypatch):
    from distnerf.components import optim
    from distnerf.model.grid import GridModel
    from distnerf.config_check import section
    from distnerf.schema import GridModelConfig, OptimConfig

    model = GridModel(torch.tensor([[-1.0] * 3, [1.0] * 3]), torch.ones(3),
                      section(GridModelConfig, {"resolutions": [8], "upsample_steps": []}))
    cfg = section(OptimConfig, {"fused": True})
    assert optim.build_optimizer(model, cfg).defaults.get("fused") is True
    monkeypatch.setattr(optim, "accepts", lambda fn, kw: False)  # an Adam whose signature has no `fused`
    assert not optim.build_optimizer(model, cfg).defaults.get("fused")


@pytest.mark.cuda
def test_a_resume_restores_only_this_devices_cuda_state():
    a, b, c = (torch.full((16,), v, dtype=torch.uint8) for v in (1, 2, 3))
    # written by a process that saw 8 GPUs (torchrun) as an older checkpoint did: every device's state
    old = {"cuda": [a, b, c, a, b, c, a, b]}
    assert D.own_cuda_state(old, 2) is c          # the same device index: its own state
    assert D.own_cuda_state(old, 0) is a          # a process now seeing one GPU: cuda:0
    assert D.own_cuda_state({"cuda": [a]}, 3) is a  # fewer states listed than the device index: no IndexError
    assert D.own_cuda_state({"cuda_device": b, "cuda": [a]}, 0) is b  # the current format: the device's own
    assert D.own_cuda_state({}, 0) is None        # written on a CPU-only machine
    state = D.rng_state()  # this process: never every device's list
    assert "cuda" not in state
    D.set_rng_state({**state, "cuda": [a, b, c]})  # restoring a state saved with more devices listed


@pytest.mark.parametrize("local_rank, visible, local_world, expect", [
    (3, 8, 8, 3),        # torchrun: one rank per GPU of the node
    (3, 1, 8, 0),        # srun --gpus-per-task=1: each task sees its own GPU as cuda:0
    (0, 1, None, 0),
    (5, 4, 8, "more local ranks than visible GPUs"),   # 8 ranks, 4 GPUs: ranks 4-7 would share cuda:0
    (1, 4, 8, "more local ranks than visible GPUs"),   # refused on every rank, not only the unlucky ones
    pytest.param(0, 0, 1, "no CUDA device is visible", marks=pytest.mark.cuda),
])
def test_more_local_ranks_than_gpus_are_refused_naming_the_setting(local_rank, visible, local_world, expect):
    if isinstance(expect, int):
        assert D.cuda_index(local_rank, visible, local_world, "0,1,2,3") == expect
        return
    with pytest.raises(ValueError, match=expect) as err:
        D.cuda_index(local_rank, visible, local_world, "0,1,2,3")
    text = str(err.value)
    assert f"LOCAL_RANK={local_rank}" in text and f"{visible} visible" in text and "CUDA_VISIBLE_DEVICES=0,1,2,3" in text


def test_ranks_sharing_one_gpu_are_found():
    entries = [(0, "n1", "GPU-a"), (1, "n1", "GPU-a"), (2, "n1", "GPU-b"), (3, "n2", "GPU-a"), (4, "n2", "GPU-a")]
    assert D.shared_devices(entries) == [[0, 1], [3, 4]]
    assert D.shared_devices([(0, "n1", "GPU-a"), (1, "n2", "GPU-a")]) == []  # same model, other hosts


@pytest.mark.cuda
def test_a_cuda_joint_run_reports_its_exchange_as_not_measured_never_zero():
    from distnerf.study.collect import comm_totals
    from distnerf.study.report import sync_rows

    gloo = comm_totals([{"exchange_bytes": 10, "exchange_s": 0.5}, {"exchange_bytes": 10, "exchange_s": 0.25}])
    assert gloo["exchange_s"] == 0.75 and gloo["exchange_bytes"] == 20
    cuda = comm_totals([{"exchange_bytes": 10, "exchange_launch_s": 0.01}])  # what CUDA runs write
    assert "exchange_s" not in cuda and cuda["exchange_launch_s"] == 0.01

    def joint(exchange_s):
        return {"ss_joint-w2": {"n": 1, "world_size": 2, "strategy": "ss", "training": "joint",
                                "parameters_per_rank": 1, "exchange_bytes_per_step": 10, "step_s_median": 2.0,
                                "exchange_s_per_step": exchange_s}}

    assert sync_rows(joint(0.5))[0]["exposed_share"] == 0.25
    row = sync_rows(joint(None))[0]
    assert row["exposed_share"] is None and row["hidden_share_of_comm"] is None


def test_barriers_and_object_collectives_use_the_host_group(monkeypatch):
    """On CUDA the default group is cpu:gloo,cuda:nccl: the checkpoint barrier and pickled objects must
    name the gloo host group (the only part of this that the CPU can show)."""
    seen = {}
    monkeypatch.setattr(D.dist, "barrier", lambda group=None: seen.setdefault("barrier", group))
    monkeypatch.setattr(D.dist, "broadcast_object_list", lambda box, src=0, group=None: seen.setdefault("bcast", group))
    monkeypatch.setattr(D.dist, "all_gather_object", lambda out, obj, group=None: seen.setdefault("gather", group))
    host = object()
    env = D.DistEnv(rank=0, world_size=2, device=torch.device("cpu"), backend="cpu:gloo,cuda:nccl", host_group=host)
    assert env.has_peers
    D.barrier(env)
    D.broadcast_object(env, 1)
    D.gather_objects(env, 1)
    assert seen == {"barrier": host, "bcast": host, "gather": host}
