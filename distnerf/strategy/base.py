"""The strategy interface: process roles, model wrapping, batch split, the step's agreement.

A strategy owns everything distributed in training: which rays a rank draws,
how the model is wrapped (data parallel or not), how the loss is normalised so
that the optimised objective does not depend on the world size, how ranks agree
to stop, and which rank writes what. Models, fields and renderers never see it.
Plain collectives (broadcast, gather, barrier, sums) are not strategy members: callers
take them from :mod:`distnerf.distributed` with the process's ``env``.
"""
from __future__ import annotations

from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Mapping

import torch
from torch import nn

from .. import checkpoint as ckpt
from ..fileio import atomic_torch_save
from .. import distributed as D
from ..distributed import DistEnv
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
    """

    total: StepStats
    mine: StepStats


class PendingAgreement:
    """A step agreement in flight: its all-reduce launched (``async_op``), its result not read.

    The trainer launches it after the forward and calls :meth:`wait` after the optimizer step, so
    the host never waits for it between forward and backward (module docstring of
    :mod:`distnerf.engine.trainer`, ``fit``).

    Args:
        mine: this rank's stats (host floats). summed: (F,) float64 CPU tensor the collective sums in
            place. work: its handle, or None when nothing was launched (no peer: ``summed`` is
            ``mine``). finish: ``(mine, total) -> StepAgreement`` (the strategy's reading of the sums).
    """

    def __init__(self, mine: StepStats, summed: torch.Tensor, work, finish):
        self.mine, self._summed, self._work, self._finish = mine, summed, work, finish

    def wait(self) -> StepAgreement:
        """The agreement: waits for the all-reduce (gloo on the CPU: done long ago on a healthy run),
        then reads the sums (a CPU tensor: no device is waited for)."""
        if self._work is not None:
            self._work.wait()
        return self._finish(self.mine, StepStats(*self._summed.numpy().tolist()))  # a CPU tensor: no device read


class LossNormalizer:
    """The loss normaliser of one step (:meth:`Strategy.loss_normalizer`): the loss is
    ``sse / divisor``; :meth:`rescale_` corrects the gradients after the backward where the
    divisor was not yet the exact one.

    Args:
        divisor: a host float, or a 0-dim tensor on the training device (a count never read).
        count: a 0-dim float64 tensor on the training device receiving the global valid count
            (its all-reduce ``work`` in flight), or None: ``divisor`` is exact, nothing to correct.
        factor: ``W x divisor``: the gradients are multiplied by ``factor / max(count, 1)``.
    """

    def __init__(self, divisor, count: torch.Tensor | None = None, work=None, factor: float = 1.0):
        self.divisor, self._count, self._work, self._factor = divisor, count, work, factor

    @property
    def exact(self) -> bool:
        """Whether ``sse / divisor`` is the loss itself (no correction of the gradients after the backward)."""
        return self._count is None

    def with_divisor_times(self, k: float) -> "LossNormalizer":
        """This normaliser with the loss divided by ``k`` times more (the correction after the backward, if
        any, unchanged): a strategy whose gradients are summed over ranks rather than averaged."""
        return LossNormalizer(self.divisor * k, self._count, self._work, self._factor)

    def rescale_(self, params) -> None:
        """Multiply the gradients of ``params`` by ``factor / N`` (N: the global valid count) after
        the backward, on the device: waits for N's all-reduce (on NCCL a stream wait, no host read).
        Nothing when the divisor was exact."""
        if self._count is None:
            return
        if self._work is not None:
            self._work.wait()
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, self._factor / self._count.clamp(min=1.0))  # dense or sparse rows alike


@dataclass(frozen=True)
class Sampling:
    """How a rank draws its ray batches (:meth:`Strategy.sampling`).

    Attributes:
        stream: the random stream of its batches: a rank's own (its index), one shared by every rank, or a
            tuple of streams (one block of the batch per stream, e.g. per region).
        ray_filter: ``fn(rays) -> (R,) bool`` (picklable; a tuple of them, one per block) of the rays that count,
            or None: every ray counts.
        rays: the rays it draws a step.
        description: how the global batch is spread over ranks, for the start-up log.
    """

    stream: int | tuple[int, ...]
    ray_filter: object | None
    rays: int
    description: str


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

    # -- the batch --------------------------------------------------------------
    def sampling(self, scene, global_rays: int) -> Sampling:
        """How this rank draws its share of a global batch of ``global_rays`` from the training split ``scene``:
        its own stream (distinct per rank), :meth:`rays_per_rank` rays, every ray counting (no filter).

        Raises:
            ValueError: as :meth:`rays_per_rank`.
        """
        rays = self.rays_per_rank(global_rays)
        return Sampling(self.env.rank, None, rays, f"{self.env.world_size} ranks x {rays} rays")

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

    def dense_gradients(self) -> bool:
        """Whether the wrapper (:meth:`wrap`, called before) needs the model's gradients dense: the trainer's step
        builder then turns ``model.sparse_grad`` off (:func:`~distnerf.components.step_path.build_step`, the one
        place it is switched off). False: the model's row-sparse gradients are fine."""
        return False

    # -- the step's exchanges ---------------------------------------------------
    def launch_step_stats(self, local: StepStats) -> PendingAgreement:
        """Launch this step's all-reduce of ``local`` (every rank at the same step) and return it
        unread (:class:`PendingAgreement`): one small CPU all-reduce (gloo, on CPU and CUDA groups
        alike), ``async_op``, so the host does not wait for the other ranks here. Its tensor fields
        are read back first (one device-to-host transfer, :meth:`StepStats.host_values`; the trainer
        passes host numbers only)."""
        mine = local.host_values()
        summed = torch.tensor(mine, dtype=torch.float64)
        # a CPU tensor on CPU and CUDA runs alike: waiting for it waits for no device
        work = D.all_reduce_(summed, async_op=True) if self.env.has_peers else None
        return PendingAgreement(StepStats(*mine), summed, work, self._finish_step_stats)

    def _finish_step_stats(self, mine: StepStats, total: StepStats) -> StepAgreement:
        """The agreement from this rank's stats and their sums over ranks (``ss`` joint counts its
        shared rays once)."""
        return StepAgreement(total, mine)

    def loss_normalizer(self, valid, batch_rays: int) -> LossNormalizer:
        """How this rank's summed squared error becomes its loss, so that the gradient the ranks end
        with is the gradient of the global mean loss (the mean over every rank's valid rays).

        Correctness. DDP averages the ranks' gradients: ``(1 / W) sum_r grad(sse_r / d)``. The global
        mean loss is ``sum_r sse_r / N`` (N the valid rays over all ranks), so ``d = N / W`` is exact.
        Every rank draws the same ``batch_rays`` B (:meth:`rays_per_rank`), so when every ray counts
        N = W B and ``d = B``: a fixed capacity, known before the forward, with no collective. With a
        ray filter (unequal counts) the loss is still ``sse / B`` and the averaged gradient
        ``sum_r grad(sse_r) / (W B)`` is multiplied by ``W B / N`` after the backward
        (:meth:`LossNormalizer.rescale_`); N's all-reduce is launched here (``async_op``, a 0-dim
        float64 tensor on the training device) and waited for only there, so no host waits for it
        between forward and backward (on NCCL the wait orders streams; the multiply is a device
        operator, nothing is read back). A gradient is linear in the loss, so scaling it after the
        backward equals scaling the loss before it; the model's closed-form regulariser gradients
        are added after (:meth:`~distnerf.components.step.TrainStep.update`) and are not scaled.

        Args:
            valid: None when every ray of the batch counts, else this rank's valid rays (a host
                number, or a 0-dim tensor on the training device: never read here).
            batch_rays: B, this rank's batch (the same on every rank).
        Returns:
            a :class:`LossNormalizer`.
        """
        if valid is None:
            return LossNormalizer(float(max(batch_rays, 1)))
        if not self.env.has_peers:  # alone: the count is the global one
            return LossNormalizer(valid.clamp(min=1) if torch.is_tensor(valid) else max(float(valid), 1.0))
        count = (valid.detach().reshape(()).to(self.env.device, torch.float64) if torch.is_tensor(valid)
                 else torch.full((), float(valid), dtype=torch.float64, device=self.env.device))
        work = D.all_reduce_(count, async_op=True)
        return LossNormalizer(float(max(batch_rays, 1)), count, work, self.env.world_size * max(batch_rays, 1))

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
        """The module that renders evaluation views and the live viewer's frames between training steps
        (``ss``: the fusion stage). Unless :attr:`renders_collectively`, only the main rank renders a live
        frame, so it must run no collective then."""
        return model

    @property
    def renders_collectively(self) -> bool:
        """Whether rendering a view needs every rank (``ss`` under torchrun: the fusion stage holds
        the regions of all ranks). Then every rank takes part in every evaluation view (the rows are
        the same on every rank, nothing to gather), and the main rank asks for a live frame in the
        step agreement (:attr:`StepStats.live_frame`) and every rank renders it after that step."""
        return False

    def finish_gradients(self) -> None:
        """After the backward, before anything reads the gradients: complete gradient exchanges the strategy
        runs outside its wrapper (``ddp`` with ``strategy.sparse_tables``). Nothing by default."""

    def eval_views(self, num_views: int) -> list[int]:
        """This rank's share of ``num_views`` evaluation views: round robin, or every view when
        rendering is collective (:attr:`renders_collectively`)."""
        if self.renders_collectively:
            return list(range(num_views))
        return list(range(self.env.rank, num_views, self.env.world_size))
