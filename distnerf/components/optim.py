"""Adam with per-group learning rates (set by the schedule, :mod:`.schedule`); lazy (row-wise)
updates for parameters with sparse gradients.
"""
from __future__ import annotations


import torch
from omegaconf import DictConfig
from torch.optim.adam import adam as adam_update

from ..distributed import accepts
from ..model.base import RadianceModel
from ..config_check import typed
from ..schema import OptimConfig
from .schedule import Clock, lr_factor


class LazyAdam(torch.optim.Adam):
    """Adam (Kingma & Ba 2015, Algorithm 1) whose parameters with a **sparse** gradient are
    updated lazily, row by row, like ``torch.optim.SparseAdam`` (and TensorFlow's LazyAdam).

    Parameters with a dense gradient get exactly ``torch.optim.Adam``'s update (fused
    when asked). For a parameter whose ``.grad`` is a sparse COO tensor over its rows
    (e.g. a voxel grid's colour features: only the rows a step's samples touched), only
    those rows are read and written: their moments and values receive exactly Adam's
    update with the parameter's step count ``t`` (bias corrections ``1 - beta^t``); the
    moments of rows without gradient are *not* decayed that step (Adam would decay them
    and still move the row by ``m / (sqrt(v) + eps)``). A row that receives gradient at
    every step is therefore updated exactly as by Adam. The state keys are Adam's
    (``step``, ``exp_avg``, ``exp_avg_sq``), so checkpoints are interchangeable.
    ``torch.optim.SparseAdam`` itself cannot hold dense parameters in the same optimizer.
    """

    @torch.no_grad()
    def step(self, closure=None):
        sparse = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None and p.grad.is_sparse:
                    sparse.append((group, p, p.grad))
                    p.grad = None  # the dense update below skips it
        loss = super().step(closure)
        for group, p, grad in sparse:
            self._lazy_update(group, p, _coalesced(grad))
            p.grad = grad
        return loss

    def _lazy_update(self, group: dict, p: torch.Tensor, grad: torch.Tensor) -> None:
        """Adam on the rows of ``grad`` (coalesced): the rows of the value and both moments are
        gathered, updated by Adam's own function ``torch.optim.adam.adam`` (the fused kernel, one
        pass, when the optimizer is fused) and written back."""
        beta1, beta2 = group["betas"]
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0, dtype=torch.float32, device=p.device)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        rows, values = grad.indices()[0], grad.values()
        value = p.index_select(0, rows)
        m = state["exp_avg"].index_select(0, rows)
        v = state["exp_avg_sq"].index_select(0, rows)
        fused = bool(group.get("fused")) and p.device.type in ("cpu", "cuda")
        adam_update([value], [values], [m], [v], [], [state["step"]], foreach=False, fused=fused,
                    amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=0.0,
                    eps=group["eps"], maximize=False)  # increments state["step"]
        p.index_copy_(0, rows, value)
        state["exp_avg"].index_copy_(0, rows, m)
        state["exp_avg_sq"].index_copy_(0, rows, v)


def _coalesced(grad: torch.Tensor) -> torch.Tensor:
    """``grad`` coalesced: as is when its row indices are already strictly increasing (what
    :func:`~distnerf.model.grid_tables.sparse_table_grad` makes; autograd's accumulation drops the
    flag, and ``coalesce`` would sort again), else ``grad.coalesce()``."""
    if grad.is_coalesced():
        return grad
    rows = grad._indices()
    if rows.shape[0] == 1 and (rows.shape[1] < 2 or bool((rows[0, 1:] > rows[0, :-1]).all())):
        return torch.sparse_coo_tensor(rows, grad._values(), grad.shape, is_coalesced=True, check_invariants=False)
    return grad.coalesce()


def build_optimizer(model: RadianceModel, cfg: DictConfig, tensor_lr: bool = False) -> torch.optim.Optimizer:
    """:class:`LazyAdam` over ``model.param_groups(cfg.lr)``; each group remembers its base lr.

    ``cfg``: the ``optim`` section, a typed node (``lr``, ``betas``, ``eps``, ``fused``: :class:`OptimConfig`).
    ``tensor_lr``: for a compiled ``step`` (:class:`~.step.TrainStep` under ``model.compile``): each group's
    learning rate a 0-dim float32 tensor, changed in place by :func:`set_lr`, so the compiled step sees one value
    that changes, not a new constant each step (which would recompile it: PyTorch's compiled-optimizer recipe);
    ``capturable`` and not ``fused`` (below).
    """
    cfg = typed(OptimConfig, cfg)
    groups = model.param_groups(float(cfg["lr"]))
    for g in groups:
        g["base_lr"] = g["lr"]
        if tensor_lr:  # on the parameters' device: a CUDA graph (or torch.compile's) reads it there, never a host scalar
            g["lr"] = torch.tensor(float(g["lr"]), dtype=torch.float32, device=_device_of(g["params"]))
    kwargs = {"betas": tuple(cfg.betas), "eps": float(cfg.eps)}
    if tensor_lr:  # compiled: PyTorch keeps torch.compile out of the fused kernel (torch.compiler.disable on
        # _fused_adam), so the compiled step is the multi-tensor update, which inductor fuses itself; capturable:
        # the step counts on the device, as a CUDA graph needs (CUDA only: eager Adam refuses it on the CPU)
        kwargs["capturable"] = any(p.is_cuda for g in groups for p in g["params"])
    elif cfg.fused and accepts(torch.optim.Adam.__init__, "fused") and all(
            p.is_floating_point() for g in groups for p in g["params"]):
        kwargs["fused"] = True
    optimizer = LazyAdam(groups, **kwargs)
    optimizer.tensor_lr = tensor_lr  # survives load_state_dict (set_lr restores a tensor lr a checkpoint replaced)
    return optimizer


def _device_of(params) -> torch.device:
    """The device of a group's parameters (the CPU for an empty group)."""
    params = list(params)
    return params[0].device if params else torch.device("cpu")


def rebuild_optimizer(old: torch.optim.Optimizer, model: RadianceModel, cfg: DictConfig,
                      tensor_lr: bool = False) -> torch.optim.Optimizer:
    """A new optimizer for ``model`` after it replaced parameter tensors (``tensor_lr``: :func:`build_optimizer`).

    State of parameters that still exist (same tensor object) is carried over;
    replaced tensors start with fresh Adam moments.
    """
    new = build_optimizer(model, cfg, tensor_lr)
    for group in new.param_groups:
        for p in group["params"]:
            if p in old.state:
                new.state[p] = old.state[p]
    for g_new, g_old in zip(new.param_groups, old.param_groups):
        if torch.is_tensor(g_new["lr"]):
            g_new["lr"].fill_(float(g_old["lr"]))
        else:
            g_new["lr"] = float(g_old["lr"])
    return new


def set_lr(optimizer: torch.optim.Optimizer, clock: Clock | int, cfg: DictConfig, train: DictConfig) -> float:
    """Apply the schedule's learning rate at ``clock`` (:func:`.schedule.lr_factor` of the ``optim`` section
    ``cfg`` over the run's ``train`` section, typed nodes; an int: the step, no budget); returns the factor."""
    factor = lr_factor(clock, cfg, train)
    for g in optimizer.param_groups:
        if torch.is_tensor(g["lr"]) and g["lr"].device == _device_of(g["params"]):
            g["lr"].fill_(g["base_lr"] * factor)  # build_optimizer(tensor_lr=True): in place, the same tensor
        elif getattr(optimizer, "tensor_lr", False):  # a float, or a CPU tensor a checkpoint's state brought
            # (loaded to the CPU): a tensor on the parameters' device again (a graph reads it there; a CPU
            # scalar would be read once, when the graph is recorded)
            g["lr"] = torch.tensor(g["base_lr"] * factor, dtype=torch.float32, device=_device_of(g["params"]))
        else:
            g["lr"] = g["base_lr"] * factor
    return factor


def split_optimizer_state(state: dict, key) -> dict:
    """An optimizer ``state_dict`` cut into independent parts by parameter group.

    Args:
        state: ``optimizer.state_dict()`` (``param_groups`` with integer ``params`` ids, ``state`` by id).
        key: ``key(group) -> hashable``: the part a group belongs to (e.g. its region).
    Returns:
        part -> a state dict of that part's groups (in their order) with the ids renumbered
        from 0; :func:`merge_optimizer_states` joins parts back. Adam's state is per
        parameter, so a part is exactly the optimizer state of its parameters.
    """
    parts: dict = {}
    for group in state["param_groups"]:
        part = parts.setdefault(key(group), {"state": {}, "param_groups": []})
        first = sum(len(g["params"]) for g in part["param_groups"])
        ids = list(range(first, first + len(group["params"])))
        part["param_groups"].append({**group, "params": ids})
        for old, new in zip(group["params"], ids):
            if old in state["state"]:
                part["state"][new] = state["state"][old]
    return parts


def merge_optimizer_states(parts: list[dict]) -> dict:
    """One optimizer ``state_dict`` from parts of :func:`split_optimizer_state`, in the order
    given (which must be the order of the new optimizer's groups)."""
    out: dict = {"state": {}, "param_groups": []}
    for part in parts:
        first = sum(len(g["params"]) for g in out["param_groups"])
        for group in part["param_groups"]:
            out["param_groups"].append({**group, "params": [first + int(i) for i in group["params"]]})
        for i, value in part["state"].items():
            out["state"][first + int(i)] = value
    return out
