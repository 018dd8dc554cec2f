"""Distributed environment: rank, world size, device, backend, seeds.

The only module (with ``strategy/``) that talks to ``torch.distributed``. A process
started by ``torchrun`` (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set) joins a process
group: nccl on CUDA, gloo on CPU. A plain ``python -m`` process runs alone with no
process group and every collective helper is the identity.
"""
from __future__ import annotations

import datetime
import os
import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist


@dataclass
class DistEnv:
    """Runtime facts of this process (passed to builders, never re-read from env)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def init_distributed(device: str = "auto", timeout_s: float = 600.0) -> DistEnv:
    """Join the process group when launched by torchrun.

    Args:
        device: ``"auto"`` (CUDA of the local rank if available, else CPU), ``"cpu"`` or ``"cuda"``.
        timeout_s: collective timeout, so that a lost rank ends the job instead of hanging.
    Raises:
        ValueError: ``device="cuda"`` requested without CUDA.
    """
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise ValueError("device=cuda requested but torch.cuda.is_available() is False")
    if "RANK" not in os.environ:
        dev = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
        return DistEnv(device=dev)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    backend = "nccl" if use_cuda else "gloo"
    if use_cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=dev if use_cuda else None)
    return DistEnv(rank, world_size, local_rank, dev, backend)


def shutdown(env: DistEnv) -> None:
    if env.distributed and dist.is_initialized():
        dist.destroy_process_group()


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (model initialisation identical on every rank)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Random states of this process (torch, numpy, python; CUDA when present)."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def broadcast_object(env: DistEnv, obj, src: int = 0):
    """``obj`` of rank ``src`` on every rank (identity without a process group)."""
    if not env.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_reduce_max(env: DistEnv, value: float) -> float:
    """Maximum of ``value`` over ranks."""
    if not env.distributed:
        return value
    t = torch.tensor([float(value)], dtype=torch.float64, device=_comm_device(env))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def all_reduce_sum(env: DistEnv, values: torch.Tensor) -> torch.Tensor:
    """Sum of a small tensor over ranks (returns a new CPU tensor)."""
    if not env.distributed:
        return values.clone()
    t = values.detach().to(_comm_device(env)).clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.cpu()


def gather_objects(env: DistEnv, obj) -> list:
    """List of every rank's ``obj`` (on every rank)."""
    if not env.distributed:
        return [obj]
    out = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier()


def _comm_device(env: DistEnv) -> torch.device:
    return env.device if env.backend == "nccl" else torch.device("cpu")
