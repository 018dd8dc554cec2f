"""Random states: seeding a process, and saving and restoring its generators' states (python,
numpy, torch, the process's own CUDA device) in a checkpoint."""
from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (model initialisation identical on every rank)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Random states of this process (torch, numpy, python; its own CUDA device's when CUDA is
    present), as data only: tensors, numbers and lists (a checkpoint loads them with
    ``weights_only=True``).

    ``numpy``: ``{"keys": (624,) int64 tensor of the MT19937 key, "pos", "has_gauss",
    "cached_gaussian"}``; ``python``: ``[version, [625 ints], gauss_next]``; ``cuda_device``: the
    (uint8) state of the current CUDA device only, so that a resume where the process sees fewer
    GPUs (8 under torchrun, then one per task under ``srun --gpus-per-task=1``) restores it.
    """
    name, keys, pos, has_gauss, cached = np.random.get_state()
    assert name == "MT19937", name
    version, internal, gauss_next = random.getstate()
    state = {"torch": torch.get_rng_state(),
             "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
                       "cached_gaussian": float(cached)},
             "python": [version, list(internal), gauss_next]}
    if torch.cuda.is_available():
        state["cuda_device"] = torch.cuda.get_rng_state(torch.cuda.current_device())
    return state


def own_cuda_state(state: dict, device_index: int):
    """The CUDA generator state of this process's device from a saved :func:`rng_state`, or None.

    ``cuda_device`` (the device's own state); an older checkpoint's ``cuda`` list (every visible
    device's, in device order) gives its entry ``device_index`` when the list has one, else its
    first: the process that wrote it may have seen more devices than this one does.
    """
    if "cuda_device" in state:
        return state["cuda_device"]
    listed = state.get("cuda") or []
    if not listed:
        return None
    return listed[device_index] if device_index < len(listed) else listed[0]


def set_rng_state(state: dict) -> None:
    """Restore :func:`rng_state`'s states (CUDA: into the current device only, see :func:`own_cuda_state`)."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if torch.cuda.is_available():
        cuda = own_cuda_state(state, torch.cuda.current_device())
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, torch.cuda.current_device())
