"""The strategy interface: process roles, model wrapping, batch split, collectives.

A strategy owns everything distributed in training: which rays a rank draws,
how the model is wrapped (data parallel or not), how the loss is normalised so
that the optimised objective does not depend on the world size, how ranks agree
to stop, and which rank writes what. Models, fields and renderers never see it.
"""
from __future__ import annotations

from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Mapping

import torch
from torch import nn

from .. import checkpoint as ckpt
from ..fileio import atomic_torch_save
from .. import dist as D
from ..dist import DistEnv
from ..config_check import section


@dataclass
class StepStats:
    """The per-step scalars all ranks agree on in one small all-reduce.

    A rank contributes its own values (flags as 0 or 1; a field may be a 0-dim tensor on
    the training device, e.g. ``valid.sum()``, so that building the stats reads nothing
    back); after the reduction each field is a float, the sum over ranks: the number of
    valid rays, and how many ranks saw a non-finite loss, passed the time budget, passed a
    checkpoint time mark, got a stop signal or hold a model whose occupancy grid emptied. Any non-zero flag acts on every rank at the
    same step. ``train_seconds``: the rank's training seconds so far (summed: the time budget's
    schedule reads their mean, the same float on every rank).
    """

    valid_rays: float
    nonfinite: float = 0.0
    over_budget: float = 0.0
    at_mark: float = 0.0
    signal: float = 0.0
    collapsed: float = 0.0
    train_seconds: float = 0.0
    live_frame: float = 0.0  # the main rank's live viewer asks every rank to render a frame after this step

    def host_values(self) -> list[float]:
        """The fields as host floats, in field order. The tensor fields are read back in
        one device-to-host transfer (the step's one host synchronisation for its flags); the
        Python numbers never travel to the device and back."""
        values = list(astuple(self))
        where = [i for i, v in enumerate(values) if torch.is_tensor(v)]
        if where:
            read = torch.stack([values[i].detach().reshape(()).double() for i in where]).tolist()  # host sync
            for i, v in zip(where, read):
                values[i] = v
        return [float(v) for v in values]


@dataclass
class StepAgreement:
    """What the per-step all-reduce tells every rank.

    Attributes:
        total: the :class:`StepStats` summed over ranks (host floats).
        mine: this rank's own values (host floats).
        loss_normalizer: divisor of this rank's summed squared error (:meth:`Strategy.reduce_step_stats`).
    """

    total: StepStats
    mine: StepStats
    loss_normalizer: float


class Strategy:
    """Base strategy (also the behaviour of a single process).

    Args:
        cfg: ``strategy`` config group. env: this process's distributed facts.
    """

    name = "base"
    #: the scene's spatial partition into regions (``ss``, once prepared), else None
    partition = None
    elastic = False
    """Whether a run resumes at another world size bit-exactly (``ss``); otherwise such a resume
    continues with other ray streams, and is warned about."""

    def __init__(self, cfg: Mapping, env: DistEnv):
        # the run's validated node passes through (section); a partial mapping (a test) may leave out the name
        self.cfg, self.env = section("strategy", cfg if "name" in cfg else {"name": self.name, **cfg}), env
        self.model: nn.Module | None = None
        self.wrapped: nn.Module | None = None

    # -- roles --------------------------------------------------------------
    @property
    def is_main(self) -> bool:
        """Whether this rank writes run-level files (config, logs, W&B, manifest)."""
        return self.env.is_main

    def sampler_stream(self) -> int:
        """Random stream of this rank's ray batches (distinct per rank)."""
        return self.env.rank

    def ray_filter(self, scene):
        """The ray filter hook of this rank's batches (``fn(rays) -> (R,) bool``, picklable),
        e.g. the rays that cross this rank's region under ``ss``; ``None``: every ray counts."""
        return None

    def rays_per_rank(self, global_rays: int) -> int:
        """This rank's sampler batch for a global batch of ``global_rays``
        (:func:`distnerf.config_check.global_batch`: ``train.global_rays``, or the world size times
        ``train.rays_per_rank``): ``global_rays / world_size`` rays drawn from this rank's own stream.

        Raises:
            ValueError: when the global batch does not split evenly.
        """
        if global_rays % self.env.world_size:
            raise ValueError(f"train.global_rays={global_rays} is not divisible by the world size "
                             f"{self.env.world_size}")
        return global_rays // self.env.world_size

    def describe_batch(self, global_rays: int) -> str:
        """How the global batch is spread over ranks (for the start-up log)."""
        return f"{self.env.world_size} ranks x {self.rays_per_rank(global_rays)} rays"

    # -- set-up and model -----------------------------------------------------
    def prepare(self, scene, run_dir, seed: int, model_cfg: dict) -> None:
        """Strategy set-up that needs the training split (``ss``: the partition)."""

    def build_model(self, model_cfg: dict, scene) -> nn.Module:
        """This rank's model: the whole scene's (every rank the same under ``ddp``), with one
        appearance row per training image (``model.appearance``)."""
        from ..model import build_model

        return build_model(model_cfg, scene.aabb, scene.background, num_images=len(scene))

    def parameter_report(self, model) -> dict:
        """What ``model.max_params`` derived for this rank's model (a
        :class:`~distnerf.model.base.RadianceModel`'s ``budget``), when set."""
        return {} if model.budget is None else {"budget": model.budget}

    def wrap(self, model: nn.Module) -> nn.Module:
        """Place ``model`` on the device and return the module whose forward trains it."""
        self.model = model.to(self.env.device)
        self.wrapped = self.model
        return self.wrapped

    def rewrap(self) -> nn.Module:
        """Re-wrap after the model replaced parameter tensors (grid upsampling)."""
        return self.wrap(self.model)

    # -- collectives -----------------------------------------------------------
    def reduce_step_stats(self, local: StepStats) -> StepAgreement:
        """This rank's step scalars summed over ranks, and the divisor of its summed squared error.

        One small all-reduce per step serves both the loss normaliser and the stop
        decision, so every rank leaves the loop at the same step. DDP averages gradients
        over ranks, so the divisor ``global_valid / world_size`` makes the averaged gradient
        the gradient of the global mean loss, even when ranks hold different numbers of
        valid rays.

        """
        mine, total, extra = self._reduce(local, self.step_extra())
        self.take_step_extra(extra)
        return StepAgreement(total, mine, max(total.valid_rays, 1.0) / self.env.world_size)

    def step_extra(self) -> list[float]:
        """Host numbers the strategy sends along in the step agreement's all-reduce (after the
        forward, before the backward); their sums go to :meth:`take_step_extra`. None by default."""
        return []

    def take_step_extra(self, sums: list[float]) -> None:
        """The sums over ranks of :meth:`step_extra`'s numbers (empty when it sent none)."""

    def _reduce(self, local: StepStats, extra: list[float] = ()) -> tuple[StepStats, StepStats, list[float]]:
        """(this rank's stats, the sum over ranks, the sums of ``extra``), all host floats: one
        device-to-host read of the tensor fields, then one CPU all-reduce (gloo, on CPU and CUDA
        groups alike) of the stats and ``extra`` together."""
        mine = local.host_values()
        summed = self.sum_over_ranks(mine + list(extra))
        return StepStats(*mine), StepStats(*summed[:len(mine)]), summed[len(mine):]

    def sum_over_ranks(self, values: list[float]) -> list[float]:
        """Host floats summed over every rank (one small CPU all-reduce; every rank must call it
        at the same step): the step's stats, or a flag read late that a checkpoint must not ignore."""
        # a CPU tensor on CPU and CUDA runs alike: reading it waits for no device
        return D.all_reduce_sum(self.env, torch.tensor(values, dtype=torch.float64)).numpy().tolist()

    def comm_stats(self) -> dict:
        """Communication measured since the last call (seconds, bytes, calls)."""
        return {}

    def check_exchange(self) -> None:
        """Raise if the gradient exchange of the steps since the last check went wrong in a way only
        the device knows (``ddp``'s bounded sparse exchange: :meth:`DDPStrategy.check_exchange`);
        collective; the trainer calls it before every checkpoint. Nothing to check by default."""

    def step_comm(self) -> dict | None:
        """Gradient communication of the step just taken, for the step profiler:
        ``{"in_hook_s", "last_return", "spans": [(launch, done), ...], "bytes"}`` (host
        ``perf_counter`` seconds), or None when the strategy exchanges no gradients."""
        return None

    # -- checkpoint ------------------------------------------------------------
    def save_model_state(self, ckpt_dir: Path, model: nn.Module, optimizer, meta: dict,
                         write=atomic_torch_save) -> None:
        """Write the model and optimizer into ``ckpt_dir`` (before the manifest).

        Replicas are identical under ``ddp``: the main rank writes one ``model.pt``.
        ``meta``: ``step``, ``train_seconds``, ``budget_fraction`` (the schedule's, or None) and
        ``budget_minutes`` (the budget it is a fraction of). ``write(state, path)``: how each file is
        written (the checkpointer's host copy for a background write).
        """
        if self.env.is_main:
            write({"model": model.state_dict(), "optimizer": optimizer.state_dict(), **meta},
                  Path(ckpt_dir) / ckpt.MODEL_FILE)

    def load_model_state(self, ckpt_dir: Path, model: nn.Module) -> dict:
        """Load the model's weights from ``ckpt_dir`` in place; returns ``optimizer`` state and the meta."""
        state = ckpt.load_file(Path(ckpt_dir) / ckpt.MODEL_FILE)
        model.load_state_dict(state["model"])
        return state

    def manifest_extra(self) -> dict:
        """Strategy facts recorded in every checkpoint manifest."""
        return {"strategy": self.name}

    # -- evaluation ------------------------------------------------------------
    def inference_model(self, model: nn.Module) -> nn.Module:
        """The module that renders evaluation views (``ss``: the fusion stage)."""
        return model

    def live_view_model(self, model: nn.Module) -> nn.Module:
        """The module the live viewer renders with between training steps. Unless
        :attr:`live_view_collective`, only the main rank renders, so it must run no collective.
        Default: :meth:`inference_model`."""
        return self.inference_model(model)

    @property
    def live_view_collective(self) -> bool:
        """Whether a live frame needs every rank (``ss`` under torchrun: the fusion stage holds
        the regions of all ranks). Then the main rank asks for a frame in the step agreement
        (:attr:`StepStats.live_frame`) and every rank renders it after that step."""
        return False

    def broadcast(self, obj, src: int = 0):
        """``obj`` of rank ``src`` on every rank (a picklable object; collective)."""
        return D.broadcast_object(self.env, obj, src)

    @property
    def writes_renders(self) -> bool:
        """Whether this rank writes the PNGs of the views it renders."""
        return True

    def gather_rows(self, rows: list) -> list:
        """Every rank's evaluation rows, sorted by view (collective)."""
        return sorted((r for part in self.gather(rows) for r in part), key=lambda r: r["view"])

    def eval_views(self, num_views: int) -> list[int]:
        """This rank's share of ``num_views`` evaluation views (round robin)."""
        return list(range(self.env.rank, num_views, self.env.world_size))

    def gather(self, obj) -> list:
        return D.gather_objects(self.env, obj)

    def barrier(self) -> None:
        D.barrier(self.env)
