"""The trainer: wires components in dependency order and runs the loop.

Data flow of one step: dataset -> sampler.host_batch(step) (waits for the
pipelined workers) -> sampler.to_device (pinned, non-blocking) ->
strategy-wrapped model forward (the whole render) -> photometric loss -> the
step's one small all-reduce launched (valid rays + stop flags, not waited for) ->
backward (gradient all-reduce inside DDP) -> optimizer -> the all-reduce read
(stops) -> metrics -> checkpoint. No host wait on a collective between forward and
backward (``Trainer.agree``).
"""
from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import ContextManager

import torch
from omegaconf import DictConfig, OmegaConf

from .. import checkpoint as ckpt
from .. import distributed as D
from ..components.loss import RayError
from ..components.schedule import BudgetClock, step_limit
from ..components.step import records_graph
from ..components.step_path import build_step
from ..data import load_scene
from ..data.images import undecoded
from ..observe.logger import METRICS_LOG, JsonlLogger, MultiLogger, NullLogger, WandbLogger, strategy_label
from ..observe.run_profiler import RunProfiler, log_profile_summaries
from ..observe.summary import input_summary_event, model_size_event, peak_rss_mb, rank_model_size
from ..renderer.output import RenderOutput
from ..sampler import batch_config, build_sampler, pixel_source
from ..sampler.base import RayBatch
from ..model import contracted
from ..config_check import ConfigError, describe_batch_rule, global_batch
from ..schema import TrainConfig
from ..strategy.base import LossNormalizer, PendingAgreement, StepAgreement, StepStats, Strategy
from .checkpoint_cadence import Checkpointer
from .evaluate import evaluate_run, image_panels, make_eval_split
from .held_out_appearance import check_appearance_protocol
from .late_flag import LateFlag
from .phases import PhaseHook, StepResult, phase_context

log = logging.getLogger("distnerf")
TEST_PANELS = 4  # test views logged to W&B as panels at the end (ground truth | prediction | depth)
RANK_FIGURES = ("step_ms", "input_wait_ms", "forward_ms", "backward_ms", "exposed_comm_ms", "optimizer_ms",
                "peak_memory_mb", "peak_rss_mb", "rays_per_s", "samples_per_ray")
"""The per-rank figures of a log row under several ranks (``rank{r}/KEY``, W&B's rank-imbalance panels): the
step breakdown's ``rank_figures`` and the trainer's own three, in the order they travel (``samples_per_ray``: the
rank's samples over its batch's rays; under ``ss`` joint training a ray's segments sum over the ranks)."""


def _nonfinite(x: torch.Tensor) -> torch.Tensor:
    """``~torch.isfinite(x)`` in two operators: ``x - x`` is 0 for a finite ``x``, NaN for +-inf and NaN."""
    return (x - x) != 0


class NonFiniteLoss(RuntimeError):
    """Training stopped because a rank's loss was NaN or infinite."""


class TrainingCollapse(NonFiniteLoss):
    """Training stopped because a model's occupancy grid emptied (nothing is sampled any more)."""


class Trainer:
    """Builds dataset, sampler, model, optimizer and checkpointer for one rank.

    Args:
        cfg: the composed config as :func:`distnerf.config_check.validate` returned it (typed:
            :class:`distnerf.schema.TrainConfig`), used as it is: it is validated once, at the entry point.
        strategy: the strategy, already holding this process's :class:`DistEnv`.
        run_dir: the run directory shared by every rank.
        stop: set by SIGUSR1/SIGTERM (:class:`distnerf.distributed.StopRequest`); any rank's request
            stops every rank at the same step with a checkpoint. ``None``: signals are not handled.
    Raises:
        TypeError: ``cfg`` was not validated (a composed config not passed through ``validate``).
    """

    def __init__(self, cfg: DictConfig, strategy: Strategy, run_dir: Path, stop: D.StopRequest | None = None):
        if not isinstance(cfg, DictConfig) or not issubclass(OmegaConf.get_type(cfg) or object, TrainConfig):
            raise TypeError("Trainer takes the validated config: distnerf.config_check.validate(cfg) "
                            "(the entry point validates once)")
        check_appearance_protocol(cfg)  # before any data is loaded
        self.cfg, self.strategy, self.env, self.run_dir = cfg, strategy, strategy.env, Path(run_dir)
        self.stop = stop if stop is not None else D.StopRequest()
        # observers of every step's phases (phases.PHASES), in the loop's thread: phase's docstring
        self.phase_hooks: list[PhaseHook] = []
        self._bar = None  # fit's progress bar (the main rank's, monitor.progress)
        self.device = self.env.device
        D.seed_everything(cfg.seed)  # identical model initialisation on every rank
        # sampler.cache_dir: pixels decoded image by image into a memory-mapped cache, never all in RAM
        self.train_scene = load_scene(cfg.dataset, "train", pixels=pixel_source(cfg.sampler))
        for split in (["test"] if cfg.eval.enabled else []) + (["val"] if cfg.monitor.val_every else []):
            # a missing or wrong-size evaluation image fails now, not after training (files and headers
            # only: the pixels are decoded when the split is evaluated)
            load_scene(cfg.dataset, split, pixels=undecoded)
        if self.env.is_main and self.train_scene.transform is not None:
            (self.run_dir / ckpt.SCENE_TRANSFORM_FILE).write_text(json.dumps(self.train_scene.transform, indent=1))
        model_cfg = cfg.model  # validated at the entry point: passed down typed
        if self.train_scene.ndc and contracted(model_cfg):
            raise ConfigError(f"config model.contraction={model_cfg['contraction']!r} with NDC rays "
                              f"(dataset.ndc=true): NDC already maps the frustum to infinity into a bounded "
                              f"box; use model.contraction=none, or dataset.ndc=false with contraction")
        strategy.prepare(self.train_scene, self.run_dir, cfg.seed, model_cfg)  # ss: the partition
        self.global_rays = global_batch(cfg.train, self.env.world_size)  # W x train.rays_per_rank, or train.global_rays
        sampling = strategy.sampling(self.train_scene, self.global_rays)
        self.rays_per_rank, self.batch_description = sampling.rays, sampling.description
        self.sampler = build_sampler(cfg.sampler, self.train_scene, self.rays_per_rank, cfg.seed,
                                     sampling.stream, self.device, sampling.ray_filter)
        # the loss's finiteness, read a step late (no host sync in the step): see agree()
        self._late_nonfinite, self._late_step = LateFlag(self.device), -1
        self._late_valid = LateFlag(self.device)  # a valid count on the device, for the logs (agree())
        self.model = strategy.build_model(model_cfg, self.train_scene)
        if self.env.is_main and cfg.model.max_params is not None:  # what the budget derived (rank 0's model)
            log.info("model.max_params=%d per rank: %s", cfg.model.max_params, strategy.parameter_report(self.model))
        hashes = ckpt.config_hashes(OmegaConf.to_container(cfg, resolve=True))
        # which rays are drawn (not how fast): resume refuses a change
        hashes.update(ckpt.config_hashes({"sampler": batch_config(cfg.sampler)}, ("sampler",)))
        # the data as found (dataset.root is not hashed: moved data resumes, the same data only)
        scene = self.train_scene
        hashes["data"] = ckpt.data_hash(scene.image_paths, scene.source, (scene.height, scene.width))
        self.checkpointer = Checkpointer(self.run_dir / "checkpoints", cfg.checkpoints, strategy, hashes)
        self.step, self.train_seconds = 0, 0.0
        self.budget_clock = BudgetClock(cfg.train)  # the schedule's p, agreed across ranks (None: no budget)
        resume_from = self.checkpointer.find_resume(cfg.resume)
        state = strategy.load_model_state(resume_from, self.model) if resume_from is not None else None
        self.wrapped = strategy.wrap(self.model)
        self.profiler = RunProfiler(cfg.profiler, self.device, self.env.rank, self.env.world_size, self.run_dir,
                                    self.model)  # always-on step breakdown (+ traces with profiler=trace)
        self.timer = self.profiler.steps
        # the step path, chosen once (components/step_path.py); refusals raise ConfigError here, at build time
        self.train_step = self._build_step()
        self._log_step_path()
        self.max_steps = step_limit(cfg.train)
        if state is not None:
            self.train_step.optimizer.load_state_dict(state["optimizer"])
            self.step, self.train_seconds = int(state["step"]), float(state["train_seconds"])
            self.budget_clock.load_state_dict(state, self.train_seconds)
            self.checkpointer.restore_rank(resume_from, self.sampler, self.step)
            if self.env.is_main:
                log.info("resumed from %s at step %d", resume_from, self.step)
        self.checkpointer.start(self.train_seconds)
        self.sampler.start(self.step)  # batches are drawn by step index: prefetch from here
        self.logger = self._make_logger(resume_from is not None)
        self.viewer = self._make_viewer()
        if resume_from is not None:
            self.logger.log({"step": self.step, "event": "resumed", "checkpoint": resume_from.name,
                             "torchrun_restart": self.env.restart_count})
        if self.env.is_main:
            log.info("schedule: %s", cfg.optim.schedule)
            log.info("global batch %d rays, %s: %s; lr %.3g (per-group multipliers from the model), not scaled "
                     "with the global batch: the loss is its mean (bench/scaling/batches.md measures W = 1, 2, 4)",
                     self.global_rays, describe_batch_rule(cfg.train), self.batch_description,
                     cfg.optim.lr)

    def activity(self) -> tuple[int, str, float]:
        """(step, phase last entered, its wall-clock start): what this rank is doing
        (:class:`distnerf.observe.progress.ProgressBeacon` publishes it for hang reports)."""
        return self.step, self.timer.current, self.timer.current_since

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.train_step.optimizer

    def save_checkpoint(self, at_mark: bool = False, background: bool = False) -> Path:
        """Write ``step_N/`` for the current step (collective; :meth:`Checkpointer.save`), after the
        strategy has checked the exchange that made these parameters (:meth:`Strategy.check_exchange`).
        ``background``: the periodic saves (with ``checkpoints.background``), committed by a thread later."""
        self.strategy.check_exchange()
        return self.checkpointer.save(self.step, self.train_seconds, self.model, self.optimizer, self.sampler,
                                      self.budget_clock.state_dict(self.step), at_mark, background)

    def _make_viewer(self):
        """``viewer.enabled``: the live web viewer, served by the main rank (see :class:`LiveViewer`);
        where a frame needs every rank (``strategy.renders_collectively``), the others follow."""
        if not self.cfg.viewer.enabled or not (self.env.is_main or self.strategy.renders_collectively):
            return None
        from .live_view import LiveFollower, LiveViewer

        return (LiveViewer if self.env.is_main else LiveFollower)(self.cfg, self.strategy, self.train_scene)

    def _make_logger(self, resumed: bool):
        if not self.env.is_main:
            return NullLogger()
        loggers = [JsonlLogger(self.run_dir / METRICS_LOG, self.step if resumed else None)]
        if self.cfg.logger.wandb.mode != "disabled":
            label = strategy_label(self.cfg.strategy)
            config = {**OmegaConf.to_container(self.cfg, resolve=True), "world_size": self.env.world_size,
                      "strategy_label": label}
            loggers.append(WandbLogger(self.cfg.logger.wandb, self.run_dir, config, resumed, label))
        return MultiLogger(loggers)

    def _build_step(self):
        """The step of the path the config chooses (:func:`~distnerf.components.step_path.build_step`)."""
        model_cfg = self.cfg.model
        return build_step(self.model, self.cfg.step, self.device, self.env.world_size, bool(model_cfg.compile),
                          model_cfg.compile_mode, self.phase, self.strategy.dense_gradients(),
                          optim_cfg=self.cfg.optim, train_cfg=self.cfg.train)

    def start_from(self, ckpt_dir: Path) -> int:
        """Continue from a checkpoint's model weights only (``ckpt_dir``: a ``step_N/`` directory of a run of the
        same model; its optimizer state, sampler and time are not loaded, unlike ``resume``): the weights loaded in
        place, then the step built again over the loaded tables (a fresh optimizer) and the model re-wrapped;
        ``self.step`` set to the checkpoint's (the schedule's learning rate and cadences; the sampler is not restarted:
        ``sampler=sync`` draws each batch by its step index, a pipelined sampler's prefetch would wait). Returns
        that step."""
        state = self.strategy.load_model_state(ckpt_dir, self.model)
        self.step = int(state["step"])
        self.train_step = self._build_step()
        self.wrapped = self.strategy.rewrap()
        return self.step

    def _log_step_path(self) -> None:
        """``step.cuda_graph``: the main rank logs how the graphed step runs on this device."""
        if not self.cfg.step.cuda_graph or not self.env.is_main:
            return
        how = ("is recorded as one CUDA graph once per grid stage (after %d eager steps) and replayed" %
               self.train_step.warmup if records_graph(self.device) else
               "runs uncaptured on the graph's fixed buffers (the CPU has no CUDA graphs: a check, not faster)")
        log.info("step.cuda_graph: the whole step %s; an eager probe step every %s steps", how,
                 self.cfg.step.probe_every or "no")

    # ----------------------------------------------------------------- loop
    def phase(self, name: str, timed: bool = True) -> ContextManager:
        """The context of the step's phase ``name`` (:data:`~.phases.PHASES`): the step timer's (``timed``) and every
        :attr:`phase_hooks` hook's, entered in order.

        The public way to observe a step (a benchmark counting host syncs per phase, a CPU core guard acting
        between steps): append ``hook`` to ``trainer.phase_hooks``; ``hook(name)`` returns a context manager that
        is entered when the phase starts and exited when it ends, e.g.::

            @contextlib.contextmanager
            def spans(name):
                start = time.perf_counter()
                yield
                print(name, time.perf_counter() - start)

            trainer.phase_hooks.append(spans)
            trainer.step_once()
        """
        return phase_context(self.timer.phase(name) if timed else None, self.phase_hooks, name)

    def agree(self, batch, sse: torch.Tensor) -> PendingAgreement:
        """Launch the step's one small all-reduce (valid rays, stop and checkpoint flags) and return it
        unread: :meth:`step_once` reads it after the optimizer step (the ``agree`` phase, untimed).

        No collective whose result the host waits for sits between forward and backward: the loss
        normaliser is the per-rank batch, a fixed capacity (:meth:`Strategy.loss_normalizer`; with a
        ray filter the global valid count travels asynchronously and corrects the gradients after the
        backward, on the device), the sparse exchange's capacity is fixed
        (:meth:`~distnerf.model.base.RadianceModel.gradient_entry_capacity`), and this agreement is
        launched here (``async_op``) and waited for after the update, when the backward's gradient
        all-reduce has already brought the ranks together.

        Why the stops stay right. Every rank launches one agreement per step and reads it at the same
        point of the same step, so every rank reads the same sums and takes the same branch: every rank
        leaves at the same step, and a checkpoint is written by all or none. A stop acts after the step
        in flight (a time budget or a signal: that step is kept, and the final checkpoint holds it).
        The non-finite-loss flag is the *previous* step's (:class:`~.late_flag.LateFlag`), so a
        non-finite loss at step k is read after step k + 1's update and every rank stops there, without
        saving: within one step. Every point that keeps the current parameters (a checkpoint, by step
        count or time mark, validation, the final checkpoint) first settles the flag not yet carried
        (:meth:`_settle_nonfinite`, a collective every rank reaches at the same step), so no checkpoint
        holds parameters a non-finite loss produced.

        Nothing is read from the device here when the batch was built on the host (its valid count was
        taken there, ``RayBatch.num_valid``) or every ray is valid (the count is the batch size); a count
        on the device (``sampler=device`` with a ray filter) travels a step late, like the flag (it is
        only logged). The model's flags are host values.
        """
        with self.phase("agree", timed=False):
            return self._launch_agreement(batch, sse)

    def _launch_agreement(self, batch, sse: torch.Tensor) -> PendingAgreement:
        if batch.num_valid is not None:  # counted on the host before the copy
            valid = batch.num_valid
        elif self.sampler.every_ray_valid:
            valid = float(batch.valid.shape[0])
        else:  # a batch built on the device: its count, for the logs, read a step late
            valid = self._late_valid.swap(batch.valid.sum())
        nonfinite, self._late_step = self._late_nonfinite.swap(_nonfinite(sse.detach())), self.step
        local = StepStats(valid_rays=valid, nonfinite=nonfinite,
                          over_budget=float(0 < self.cfg.train.max_minutes * 60.0 <= self.train_seconds),
                          at_mark=float(self.checkpointer.mark_passed(self.train_seconds)),
                          signal=float(self.stop.requested), collapsed=float(bool(self.train_step.collapsed())),
                          train_seconds=self.train_seconds,
                          live_frame=float(self.viewer is not None and self.viewer.wants_frame()))
        return self.strategy.launch_step_stats(local)

    def _run_step(self) -> tuple[RayBatch, RenderOutput, RayError, StepAgreement]:
        """The step without its bookkeeping: the batch (``input_wait``, ``copy``), the model's schedule and learning
        rate (``model_update``), then the chosen step (:func:`~distnerf.components.step_path.build_step`): forward,
        the step agreement launched (:meth:`agree`), the loss divided by the strategy's normaliser
        (:meth:`loss_normalizer`: a host number or a device tensor, never read), backward, its gradients corrected
        where the normaliser says so, optimizer (or one replayed graph); then the agreement read (``step_sync``).
        ``self.step`` is not advanced. Returns (batch, model outputs, their :class:`RayError`, the agreement)."""
        step = self.step
        with self.phase("input_wait"):  # sync builds the batch here; pipelined waits for a worker
            batch = self.sampler.host_batch(step)
        with self.phase("copy"):
            batch = self.sampler.to_device(batch)
        with self.phase("model_update"):
            if self.train_step.prepare(step, self.budget_clock.read(step)):  # parameters replaced: rewrap too
                self.wrapped = self.strategy.rewrap()
        batch, out, error, pending = self.train_step.run(self.wrapped, batch, step, self.loss_normalizer, self.agree,
                                                         self._after_backward)
        with self.phase("step_sync"):  # after the update: the host waits for no rank before the backward
            agreed = pending.wait()
        # the mean over ranks: the same float everywhere (read by the next step's schedule)
        self.budget_clock.agree(agreed.total.train_seconds / self.env.world_size)
        return batch, out, error, agreed

    def _after_backward(self, norm: LossNormalizer) -> None:
        """The gradients completed (the strategy's exchanges outside its wrapper), then corrected by ``norm``."""
        self.strategy.finish_gradients()
        norm.rescale_(self.model.parameters())

    def loss_normalizer(self, batch: RayBatch) -> LossNormalizer:
        """The strategy's normaliser of this batch's summed error (:meth:`Strategy.loss_normalizer`):
        every ray valid (no ray filter): the batch size; else its valid count (host, or on the device:
        never read)."""
        if self.sampler.every_ray_valid:
            valid = None
        else:
            valid = batch.num_valid if batch.num_valid is not None else batch.valid.sum()
        return self.strategy.loss_normalizer(valid, len(batch.valid))

    def _settle_nonfinite(self) -> None:
        """Read the non-finite flag the last agreement did not carry and stop (without saving) if
        any rank's loss was non-finite: before anything keeps the current parameters. Collective:
        every rank calls it at the same step (every rank swaps the flag at every step, so ``pending``
        is the same on all)."""
        if not self._late_nonfinite.pending:
            return
        # collective: a CPU tensor on CPU and CUDA runs alike, reading it waits for no device
        ranks = D.all_reduce_sum(self.env, torch.tensor([self._late_nonfinite.take()], dtype=torch.float64))[0].item()
        if ranks:
            self._stop_nonfinite(ranks, self._late_step)

    def fit(self) -> dict:
        """Train until ``train.max_steps``, the time budget or a stop signal (a loop over :meth:`step_once`), then
        evaluate the test split."""
        self._bar, stop_reason, segment_start = self._progress_bar(self.max_steps), "max_steps", self.train_seconds
        loop_start = time.perf_counter()
        while self.step < self.max_steps:
            stop = self.step_once().stop
            if stop is not None:  # every rank leaves after this step
                stop_reason = stop
                break
        return self._finish(stop_reason, self._bar, segment_start, time.perf_counter() - loop_start)

    def step_once(self) -> StepResult:
        """One step of the loop (:meth:`fit`'s body): the step (:meth:`_run_step`), its stops (a non-finite loss or an
        emptied occupancy grid on any rank raise, after closing the trainer), ``self.step`` advanced, the profiler's
        end of the step; then, outside the step's time (the ``after_step`` phase), the metrics row every
        ``monitor.log_every`` steps, validation, a checkpoint when due, the live viewer. Every phase is observable
        through :attr:`phase_hooks` (:meth:`phase`).

        Returns:
            a :class:`StepResult`; ``stop`` set when every rank leaves the loop after this step.
        Raises:
            NonFiniteLoss: a rank's loss was NaN or infinite (the previous step's: :meth:`agree`).
            TrainingCollapse: a rank's occupancy grid emptied.
        """
        start = time.perf_counter()
        self.timer.begin_step()
        batch, out, error, agreed = self._run_step()
        total = agreed.total  # over ranks: the valid rays, and how many ranks raised each flag
        if total.nonfinite:  # the previous step's loss (agree's docstring)
            self._stop_nonfinite(total.nonfinite, self.step - 1)
        if total.collapsed:
            self._stop_collapsed(total.collapsed)
        self.step += 1
        with self.phase("end_step", timed=False):
            done = self.profiler.end_step(self.step - 1, agreed.mine.valid_rays, out.num_samples,
                                          self.strategy.step_comm())  # after the step's GPU work (CUDA: its sync)
        step_seconds = done - start
        self.train_seconds += step_seconds
        with self.phase("after_step", timed=False):
            self._after_step(out, batch, error, agreed, step_seconds)
        stop = ("time_budget" if total.over_budget else "signal") if (total.over_budget or total.signal) else None
        return StepResult(batch, out, error, agreed, step_seconds, stop)

    def _after_step(self, out, batch, error: RayError, agreed: StepAgreement, step_seconds: float) -> None:
        """Between steps, in this thread: the metrics row, validation, a checkpoint, the live viewer."""
        total, bar = agreed.total, self._bar
        if self.step % self.cfg.monitor.log_every == 0 or self.step == self.max_steps:
            self._log_step(out, batch, error, total.valid_rays, agreed.mine.valid_rays, step_seconds, bar)
        if bar is not None:
            bar.update(1)
        val_every = self.cfg.monitor.val_every
        if val_every and self.step % val_every == 0:
            self.timer.mark("evaluate")  # outside the step: named for hang reports, not timed
            self._settle_nonfinite()
            self.evaluate_val()
        # some rank passed a time mark (everyone saves at this step), or the checkpoints.every cadence
        if total.at_mark or self.checkpointer.due(self.step):
            self.timer.mark("checkpoint")  # its barrier waits for every rank
            self._settle_nonfinite()
            self.save_checkpoint(at_mark=bool(total.at_mark), background=True)
        if self.viewer is not None:  # between steps, in this thread: the model is not changing
            self.viewer.after_step(self.model, self.step, float(total.valid_rays) / max(step_seconds, 1e-9),
                                   frame_agreed=bool(total.live_frame))

    def _stop_nonfinite(self, ranks: float, step: int) -> None:
        """Stop without saving: ``ranks`` ranks had a non-finite loss at ``step``."""
        msg = f"non-finite loss at step {step} on {int(ranks)} rank(s); stopping without saving"
        self._stop_without_saving(NonFiniteLoss(msg), {"event": "nonfinite_loss"})

    def _stop_without_saving(self, err: NonFiniteLoss, row: dict) -> None:
        """Log ``err``'s message and the event ``row`` at this step, close, raise ``err`` (no checkpoint)."""
        log.error(str(err))
        self.logger.log({"step": self.step, **row})
        self.end_view("**stopped**", str(err))
        self.close()
        raise err

    def _stop_collapsed(self, ranks: float) -> None:
        """Stop like a non-finite loss when a model's occupancy grid emptied on ``ranks`` ranks
        (nothing is sampled any more, so nothing can learn again): no checkpoint of the collapsed model."""
        mine = self.train_step.collapsed()
        msg = (f"training collapsed at step {self.step} on {int(ranks)} rank(s)"
               f"{' (here: ' + ', '.join(mine) + ' is empty)' if mine else ''}: every occupancy cell fell below "
               f"model.occupancy_threshold, so no sample is marched any more. Likely cause: a learning rate too "
               f"high for this model (optim.lr={self.cfg.optim.lr}) or a too-high occupancy_threshold; "
               f"stopping without saving")
        self._stop_without_saving(TrainingCollapse(msg), {"event": "occupancy_collapse", "parts": mine})

    def _finish(self, stop_reason: str, bar, segment_start: float, loop_wall_s: float) -> dict:
        """After the loop (``loop_wall_s``: its wall seconds in this process, validation, checkpoints
        and the live viewer's frames included; ``bar``: the progress bar or None): profile
        summaries, the final checkpoint, the test split."""
        if bar is not None:
            bar.close()
        if stop_reason == "signal":  # the live page says how training ended (the test split may follow)
            self.end_view(f"**stopped** by {self.stop.signal or 'a signal on another rank'} at step {self.step}")
        else:  # max_steps, or the time budget
            self.end_view(f"**finished** at step {self.step}" + (" (time budget: train.max_minutes)"
                                                                 if stop_reason == "time_budget" else ""))
        self.timer.mark("evaluate")  # final checkpoint, summaries and the test split (hang reports)
        self.sampler.close()  # workers are not needed for evaluation; its state (next step) stays
        self.train_step.release()  # a recorded step's memory pool is not needed for evaluation
        self._settle_nonfinite()  # before the final checkpoint (collective)
        summaries = D.gather_objects(self.env, self.profiler.finish())  # collective: every rank's breakdown to all
        # collective: every rank's parameters and peak memory
        sizes = D.gather_objects(self.env, rank_model_size(self.model, self.strategy.parameter_report(self.model),
                                                            self.device))
        if self.env.is_main:
            log_profile_summaries(summaries, self.logger, self.step)
            log.info("training stopped at step %d (%s) after %.1f s of training (%.1f s of wall time in the loop "
                     "this session: validation, checkpoints and the viewer included)", self.step, stop_reason,
                     self.train_seconds, loop_wall_s)
            self.logger.log(input_summary_event(self.timer.run_totals, self.train_seconds - segment_start,
                                                self.sampler.name, self.step))
            self.logger.log(model_size_event(sizes, self.step))
        if self.checkpointer.final_wanted(stop_reason):
            saved = self.save_checkpoint()
            if stop_reason == "signal" and self.env.is_main:
                log.warning("stopped by %s at step %d: checkpoint %s written; continue with resume=true",
                            self.stop.signal or "a signal on another rank", self.step, saved)
                self.logger.log({"step": self.step, "event": "signal_stop", "signal": self.stop.signal})
        metrics = self.evaluate_test() if self.cfg.eval.enabled and stop_reason != "signal" else {}
        self.close()
        return {"step": self.step, "stop_reason": stop_reason, **metrics}

    def _progress_bar(self, max_steps: float):
        """The main rank's tqdm bar of the steps (``monitor.progress``), else None."""
        if not self.env.is_main or not self.cfg.monitor.progress:
            return None
        from tqdm import tqdm

        return tqdm(total=None if math.isinf(max_steps) else max_steps, initial=self.step, dynamic_ncols=True,
                    desc="train")

    def _log_step(self, out, batch, error: RayError, global_valid, local_valid, step_seconds, bar):
        """The step's metrics row (main rank's figures; with peers, every rank's own under ``rankR/``):
        ``loss``, the mean per-ray training error of this rank's rows that counted (colour, distortion
        and coarse pass: the step's own :class:`RayError`), ``psnr`` of their colour error alone,
        throughput, learning rate, the step breakdown."""
        loss, mse = error.row_means()
        row = {"step": self.step, "loss": loss, "psnr": -10 * math.log10(max(mse, 1e-10)),
               "rays_per_s": global_valid / max(step_seconds, 1e-9), "samples_per_ray":
               out.num_samples / max(len(batch.rgb), 1), "lr": self.optimizer.param_groups[0]["lr"],
               "train_seconds": self.train_seconds,
               **({} if self.budget_clock.fraction is None else {"budget_fraction": self.budget_clock.fraction}),
               **{f"time_{k}": v for k, v in self.timer.pop().items()}, **self.strategy.comm_stats(),
               **self.timer.recent_figures(self.cfg.monitor.log_every), **self.train_step.metrics()}
        for key, name in (("num_density_samples", "density_samples_per_ray"),
                          ("num_colour_samples", "colour_samples_per_ray")):
            count = getattr(out, key)
            if count is not None:  # packed engine: density evaluations (both passes) and coloured samples
                row[name] = count / max(len(batch.rgb), 1)
        grid_res = self.model.resolution
        if grid_res is not None:
            row["grid_resolution"] = grid_res
        if self.env.has_peers:  # every rank's own figures, gathered to one row (rank imbalance in one W&B run)
            self.timer.mark("step_sync")  # a collective between steps: what a hang report names while it waits
            mine = {**self.timer.rank_figures(self.cfg.monitor.log_every), "peak_rss_mb": peak_rss_mb(),
                    "rays_per_s": float(local_valid) / max(step_seconds, 1e-9),
                    "samples_per_ray": row["samples_per_ray"]}
            assert set(mine) <= set(RANK_FIGURES), sorted(set(mine) - set(RANK_FIGURES))
            # collective: one float all-gather (a figure a rank lacks travels as NaN and is left out of the row)
            gathered = D.all_gather_floats(self.env, [mine.get(k, math.nan) for k in RANK_FIGURES])
            for r, figs in enumerate(gathered.tolist()):
                row.update({f"rank{r}/{k}": v for k, v in zip(RANK_FIGURES, figs) if not math.isnan(v)})
        self.logger.log(row)
        if bar is not None:
            bar.set_postfix(loss=f"{loss:.4f}", psnr=f"{row['psnr']:.2f}", rays_s=f"{row['rays_per_s']:.0f}")

    # ----------------------------------------------------------------- evaluation
    @property
    def _image_panels(self) -> bool:
        """Validation and test panels go to W&B (the same answer on every rank: it decides who writes PNGs)."""
        return self.cfg.logger.wandb.mode != "disabled" and self.cfg.logger.wandb.log_images

    def evaluate_val(self) -> None:
        """Mean PSNR over ``monitor.val_views`` views of the validation split, logged (``val_psnr``);
        with W&B images, their panels."""
        start = time.perf_counter()
        out_dir = self.run_dir / "val" / f"step_{self.step:08d}" if self._image_panels else None
        res = make_eval_split(self.cfg, self.model, self.strategy)("val", self.cfg.monitor.val_views, 1, out_dir, None)
        psnrs = [r["psnr"] for r in res["rows"]]
        self.logger.log({"step": self.step, "val_psnr": sum(psnrs) / len(psnrs),
                         "val_seconds": time.perf_counter() - start})
        if out_dir is not None and self.env.is_main:
            self.logger.log_images(self.step, image_panels(res["scene"], res["rows"], out_dir, "val"))

    def evaluate_test(self) -> dict:
        """Test-split PSNR/SSIM(/LPIPS); renders under ``RUN/test/``; ``metrics.json`` on rank 0; with W&B
        images, the first :data:`TEST_PANELS` test views as panels."""
        metrics = evaluate_run(self.cfg, self.model, self.strategy, self.run_dir, self.step,
                               make_eval_split(self.cfg, self.model, self.strategy))
        if self._image_panels and self.env.is_main:
            scene, rows = metrics.pop("scene"), metrics.pop("rows")
            self.logger.log_images(self.step, image_panels(scene, rows[:TEST_PANELS], self.run_dir / "test", "test"))
        return {k: v for k, v in metrics.items() if k not in ("scene", "rows")}

    def end_view(self, status: str, reason: str | None = None) -> None:
        """Tell the live viewer's page how the run ended (``status``, markdown, then ``reason``, plain
        text: :meth:`~distnerf.engine.live_view.LiveViewer.end`), shown until the viewer closes. No
        viewer: nothing."""
        if self.viewer is not None:
            self.viewer.end(status, reason)

    def close_viewer(self, status: str, reason: str | None = None) -> None:
        """A run that raised (``distnerf.train``): the live viewer's page told why (:meth:`end_view`),
        then the viewer closed, before the process group and the rest of the trainer go."""
        if self.viewer is not None:
            self.end_view(status, reason)
            self.viewer.close()
            self.viewer = None

    def close(self) -> None:
        self.checkpointer.close()  # a background checkpoint still in flight (a stop without a final save)
        self.sampler.close()
        self.logger.close()
        if self.viewer is not None:
            self.viewer.close()
            self.viewer = None
