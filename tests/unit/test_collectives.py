"""Every collective goes through the distnerf/distributed/ package: a scan of the package for torch.distributed
collectives (aliases and `from ... import` included), and the helpers' device checks."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

PACKAGE = Path(__file__).resolve().parents[2] / "distnerf"
COLLECTIVES = {"all_reduce", "all_gather", "all_gather_object", "broadcast", "broadcast_object_list",
               "reduce_scatter", "reduce_scatter_tensor", "all_gather_into_tensor", "barrier", "monitored_barrier",
               "gather", "gather_object", "scatter", "scatter_object_list", "reduce", "all_to_all",
               "all_to_all_single", "send", "recv", "isend", "irecv", "batch_isend_irecv"}
ALLOWED_IMPORTS = {"torch.distributed.elastic.multiprocessing.errors"}  # @record in train.py: not a collective


def violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    aliases, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch.distributed" or a.name.startswith("torch.distributed."):
                    if a.name not in ALLOWED_IMPORTS:
                        aliases.add(a.asname or a.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch"):
            mod = node.module or ""
            for a in node.names:
                if mod == "torch" and a.name == "distributed":
                    aliases.add(a.asname or "distributed")
                elif mod.startswith("torch.distributed") and mod not in ALLOWED_IMPORTS:
                    if a.name in COLLECTIVES:
                        found.append(f"{path.name}:{node.lineno} imports the collective {a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in COLLECTIVES:
            base = ast.unparse(node.value)
            if base in aliases or base in ("torch.distributed", "dist") and "dist" in aliases:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} calls {base}.{node.attr}")
    return found


def test_no_collective_outside_the_distributed_package():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] != "distributed":
            found += violations(path)
    assert not found, "\n".join(found)


def test_the_scan_finds_aliases_and_from_imports(tmp_path):
    probe = PACKAGE / "strategy" / "_probe_collectives.py"
    probe.write_text("import torch.distributed as td\nfrom torch.distributed import all_gather as ag\n"
                     "def f(t):\n    td.all_reduce(t)\n    td.barrier()\n")
    try:
        found = violations(probe)
    finally:
        probe.unlink()
    assert any("td.all_reduce" in v for v in found) and any("td.barrier" in v for v in found)
    assert any("imports the collective all_gather" in v for v in found)
    assert violations(PACKAGE / "distributed" / "collectives.py")  # the helpers themselves call them: the scan sees it


def test_helpers_are_the_identity_without_a_process_group():
    from distnerf import distributed as D

    t = torch.arange(3.0)
    assert D.all_reduce_(t) is None and torch.equal(t, torch.arange(3.0))
    assert [p.tolist() for p in D.all_gather(t)] == [[0.0, 1.0, 2.0]]
    assert D.world_size() == 1 and D.rank() == 0
    alone = D.all_gather_floats(D.DistEnv(), [1, 2.5, float("nan"), True])  # no peers: this rank's row, no exchange
    assert alone.shape == (1, 4) and alone.dtype == torch.float64
    assert alone[0, :2].tolist() == [1.0, 2.5] and alone[0, 2].isnan() and alone[0, 3] == 1.0


def test_all_reduce_or_packs_eight_flags_a_byte_and_is_the_identity_alone(monkeypatch):
    """Without peers the flags come back untouched, and nothing is counted as sent. With a peer (the gather stood
    in for: this rank's bytes, then a second rank's written by hand) 11 flags travel as 2 bytes, flag 8 i + j in bit
    j of byte i, the padding zero; the OR is unpacked to the flags' shape."""
    from distnerf import distributed as D
    from distnerf.distributed import collectives

    flags = torch.tensor([1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1], dtype=torch.bool)
    assert D.all_reduce_or(D.DistEnv(), flags) is flags
    assert D.all_reduce_or_bytes(1, 64 ** 3) == 0
    assert D.all_reduce_or_bytes(2, 64 ** 3) == 2 * 32768 and D.all_reduce_or_bytes(2, 11) == 4
    sent = []

    def gather(packed):  # rank 0's bytes, then rank 1's: flags 1 and 8 (0b00000010, 0b00000001)
        sent.append(packed.tolist())
        return torch.cat([packed, torch.tensor([2, 1], dtype=torch.uint8)]), None

    monkeypatch.setattr(collectives, "all_gather_into", gather)
    two = D.DistEnv(rank=0, world_size=2, backend="gloo")
    got = D.all_reduce_or(two, flags.view(1, 11))
    assert sent == [[0b10000001, 0b00000100]]
    assert collectives.pack_bits(torch.ones(9, dtype=torch.bool)).tolist() == [255, 1]
    assert got.shape == (1, 11) and got.dtype == torch.bool
    assert got.view(-1).tolist() == [True, True, False, False, False, False, False, True, True, False, True]


def test_a_tensor_the_group_cannot_take_is_refused_naming_the_caller():
    """A one-rank gloo group (the CPU suite's backend): a tensor elsewhere than on the CPU
    (``meta`` here; a CUDA tensor on a CUDA machine) is an error naming this file's line."""
    import torch.distributed as dist

    from distnerf import distributed as D
    from tests.conftest import free_port

    store = dist.TCPStore("127.0.0.1", free_port(), 1, True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        t = torch.ones(2)
        D.all_reduce_(t)  # CPU: fine
        assert t.tolist() == [1.0, 1.0] and [p.tolist() for p in D.all_gather(t)] == [[1.0, 1.0]]
        with pytest.raises(RuntimeError, match=r"test_collectives.py:\d+: a tensor on meta passed to a collective "
                                               r"of the gloo group, which takes cpu tensors only"):
            D.all_reduce_(torch.empty(2, device="meta"))
        with pytest.raises(RuntimeError, match=r"test_collectives.py:\d+: a tensor on meta"):
            D.all_gather(torch.empty(2, device="meta"))
    finally:
        dist.destroy_process_group()


@pytest.mark.cuda
def test_cuda_index_binds_local_rank_only_when_that_many_devices_are_visible():
    from distnerf.distributed import cuda_index

    assert cuda_index(3, visible=8) == 3  # torchrun: one rank per GPU of the node
    assert cuda_index(3, visible=1) == 0  # srun --gpus-per-task=1: each task sees its own GPU as 0
    assert cuda_index(0, visible=1) == 0


@pytest.mark.cuda
def test_gloo_on_cuda_lets_local_ranks_share_the_visible_gpus_and_refuses_an_unknown_backend(monkeypatch):
    """``dist_backend=gloo``: local ranks take the visible devices round-robin (two ranks on a one-GPU
    machine share device 0, which ``cuda_index`` refuses); ``init_distributed`` names a wrong backend before
    joining any group; on the CPU ``gloo`` is the ``auto`` group."""
    from distnerf.distributed import cuda_index, init_distributed, shared_cuda_index

    assert [shared_cuda_index(r, visible=1) for r in range(3)] == [0, 0, 0]
    assert [shared_cuda_index(r, visible=2) for r in range(4)] == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="more local ranks than visible GPUs"):
        cuda_index(2, visible=2, local_world_size=3)  # the NCCL path: a third rank on two GPUs is refused
    with pytest.raises(ValueError, match="no CUDA device is visible"):
        shared_cuda_index(0, visible=0)
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match="dist_backend must be auto or gloo, got 'mpi'"):
        init_distributed("cpu", timeout_s=10, setup_timeout_s=None, backend="mpi")
    alone = init_distributed("cpu", timeout_s=10, setup_timeout_s=None, backend="gloo")
    assert alone.device == torch.device("cpu") and not alone.distributed


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (tools/gpu_check.sh runs it: cuda_tests)")
def test_two_ranks_share_one_cuda_device_through_gloo():
    """Issue 50 item 6: ``dist_backend=gloo`` lets two ranks hold the one GPU and exchange CUDA tensors."""
    from tests.conftest import spawn
    from tests.dist.workers import gloo_cuda_worker

    spawn(gloo_cuda_worker, 2, timeout=120)


def test_a_bucket_found_dense_is_looked_at_again_only_every_sparse_revisit_calls():
    from distnerf.strategy.ddp import CommStats, HookState
    from distnerf.strategy.sparse_exchange import SPARSE_REVISIT

    state = HookState(CommStats(), 1, None, sparse_min_numel=10, sparse_max_density=0.25)
    big, small = torch.zeros(100), torch.zeros(5)
    key = (0, 100)
    assert state.try_sparse(key, big)  # first call: look
    state.found_dense(key)
    attempts = [state.try_sparse(key, big) for _ in range(2 * SPARSE_REVISIT)]
    assert attempts.index(True) == SPARSE_REVISIT - 1 and sum(attempts) == SPARSE_REVISIT + 1
    assert not state.try_sparse((1, 5), small)  # below sparse_min_numel: never
    assert state.try_sparse((0, 120), torch.zeros(120))  # a rebuilt bucket (other size) is a new bucket
    off = HookState(CommStats(), 1, None, sparse_min_numel=None, sparse_max_density=0.25)
    assert not off.try_sparse(key, big)
