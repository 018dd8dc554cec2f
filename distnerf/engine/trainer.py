"""The trainer: wires components in dependency order and runs the loop.

Data flow of one step: dataset -> sampler.host_batch(step) (waits for the
pipelined workers) -> sampler.to_device (pinned, non-blocking) ->
strategy-wrapped model forward (the whole render) -> photometric loss -> the
step's one all-reduce (valid rays + stop flags) -> backward (gradient all-reduce
inside DDP) -> optimizer -> metrics -> checkpoint.
"""
from __future__ import annotations

import json

import logging
import math
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from .. import checkpoint as ckpt
from .. import dist as D
from ..components.schedule import budgeted, step_limit
from ..components.step import TrainStep
from ..data import load_scene
from ..data.images import undecoded
from ..observe.logger import METRICS_LOG, JsonlLogger, MultiLogger, NullLogger, WandbLogger, strategy_label
from ..observe.run_profiler import RunProfiler, log_profile_summaries
from ..sampler import batch_config, build_sampler, pixel_source
from ..model import contracted
from ..config_check import ConfigError, validate
from ..strategy.base import StepAgreement, StepStats, Strategy
from .checkpoint_cadence import Checkpointer
from .evaluate import evaluate_run, image_panels, make_eval_split
from .held_out_appearance import check_appearance_protocol
from .late_flag import LateFlag

log = logging.getLogger("distnerf")
TEST_PANELS = 4  # test views logged to W&B as panels at the end (ground truth | prediction | depth)


def peak_rss_mb() -> float | None:
    """This process's peak resident memory (``VmHWM``, MiB), None where /proc is not there."""
    try:
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) / 1024 for ln in f if ln.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None


class NonFiniteLoss(RuntimeError):
    """Training stopped because a rank's loss was NaN or infinite."""


class TrainingCollapse(NonFiniteLoss):
    """Training stopped because a model's occupancy grid emptied (nothing is sampled any more)."""


class Trainer:
    """Builds dataset, sampler, model, optimizer and checkpointer for one rank.

    Args:
        cfg: the composed, validated config (``conf/train.yaml``, :class:`distnerf.schema.TrainConfig`).
        strategy: the strategy, already holding this process's :class:`DistEnv`.
        run_dir: the run directory shared by every rank.
        stop: set by SIGUSR1/SIGTERM (:class:`distnerf.dist.StopRequest`); any rank's request
            stops every rank at the same step with a checkpoint. ``None``: signals are not handled.
    """

    def __init__(self, cfg: DictConfig, strategy: Strategy, run_dir: Path, stop: D.StopRequest | None = None):
        cfg = validate(cfg)
        check_appearance_protocol(cfg)  # before any data is loaded
        self.cfg, self.strategy, self.env, self.run_dir = cfg, strategy, strategy.env, Path(run_dir)
        self.stop = stop if stop is not None else D.StopRequest()
        self.device = self.env.device
        D.seed_everything(cfg.seed)  # identical model initialisation on every rank
        # sampler.cache_dir: pixels decoded image by image into a memory-mapped cache, never all in RAM
        self.train_scene = load_scene(cfg.dataset, "train", pixels=pixel_source(cfg.sampler))
        for split in (["test"] if cfg.eval.enabled else []) + (["val"] if cfg.train.val_every else []):
            # a missing or wrong-size evaluation image fails now, not after training (files and headers
            # only: the pixels are decoded when the split is evaluated)
            load_scene(cfg.dataset, split, pixels=undecoded)
        if strategy.is_main and self.train_scene.transform is not None:
            (self.run_dir / ckpt.SCENE_TRANSFORM_FILE).write_text(json.dumps(self.train_scene.transform, indent=1))
        model_cfg = cfg.model  # validated at the entry point: passed down typed
        if self.train_scene.ndc and contracted(model_cfg):
            raise ConfigError(f"config model.contraction={model_cfg['contraction']!r} with NDC rays "
                              f"(dataset.ndc=true): NDC already maps the frustum to infinity into a bounded "
                              f"box; use model.contraction=none, or dataset.ndc=false with contraction")
        strategy.prepare(self.train_scene, self.run_dir, cfg.seed, model_cfg)  # ss: the partition
        self.rays_per_rank = strategy.rays_per_rank(cfg.train.global_rays)
        self.sampler = build_sampler(cfg.sampler, self.train_scene, self.rays_per_rank, cfg.seed,
                                     strategy.sampler_stream(), self.device, strategy.ray_filter(self.train_scene))
        # the loss's finiteness, read a step late (no host sync in the step): see agree()
        self._late_nonfinite, self._late_step = LateFlag(self.device), -1
        self.model = strategy.build_model(model_cfg, self.train_scene)
        if self.env.is_main and cfg.model.max_params is not None:  # what the budget derived (rank 0's model)
            log.info("model.max_params=%d per rank: %s", cfg.model.max_params, strategy.parameter_report(self.model))
        if cfg.model.compile:  # in place, so DDP re-wraps keep it; compile time reported by the profiler
            self.model.compile(mode=cfg.model.compile_mode)
        hashes = ckpt.config_hashes(OmegaConf.to_container(cfg, resolve=True))
        # which rays are drawn (not how fast): resume refuses a change
        hashes.update(ckpt.config_hashes({"sampler": batch_config(cfg.sampler)}, ("sampler",)))
        self.checkpointer = Checkpointer(self.run_dir / "checkpoints", cfg.train, strategy, hashes)
        self.step, self.train_seconds = 0, 0.0
        self.budget_fraction: float | None = 0.0 if budgeted(cfg.train) else None  # the schedule's p, agreed
        self._prepared: tuple[int, float | None] = (-1, None)  # (step, the fraction its prepare read)
        resume_from = self.checkpointer.find_resume(cfg.resume)
        state = strategy.load_model_state(resume_from, self.model) if resume_from is not None else None
        self.wrapped = strategy.wrap(self.model)
        self.step_fn = TrainStep(self.model, cfg.train, phase=lambda name: self.timer.phase(name))
        if state is not None:
            self.step_fn.optimizer.load_state_dict(state["optimizer"])
            self.step, self.train_seconds = int(state["step"]), float(state["train_seconds"])
            if self.budget_fraction is not None:
                self.budget_fraction = self._resumed_fraction(state)
            self.checkpointer.restore_rank(resume_from, self.sampler, self.step)
            if self.env.is_main:
                log.info("resumed from %s at step %d", resume_from, self.step)
        self.checkpointer.start(self.train_seconds)
        self.sampler.start(self.step)  # batches are drawn by step index: prefetch from here
        self.profiler = RunProfiler(cfg.profiler, self.device, self.env.rank, self.env.world_size, self.run_dir,
                                    self.model)  # always-on step breakdown (+ traces with profiler=trace)
        self.timer = self.profiler.steps
        self.logger = self._make_logger(resume_from is not None)
        self.viewer = self._make_viewer()
        if resume_from is not None:
            self.logger.log({"step": self.step, "event": "resumed", "checkpoint": resume_from.name,
                             "torchrun_restart": self.env.restart_count})
        if self.env.is_main:
            log.info("schedule: %s", cfg.train.schedule)
            log.info("global batch %d rays: %s; lr %.3g (per-group multipliers from the model; not scaled "
                     "with the world size since the global batch is fixed)", cfg.train.global_rays,
                     strategy.describe_batch(cfg.train.global_rays), cfg.train.lr)

    def progress(self) -> tuple[int, str, float]:
        """(step, phase last entered, its wall-clock start): what this rank is doing
        (:class:`distnerf.observe.progress.ProgressBeacon` publishes it for hang reports)."""
        return self.step, self.timer.current, self.timer.current_since

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.step_fn.optimizer

    def save_checkpoint(self, at_mark: bool = False) -> Path:
        """Write ``step_N/`` for the current step (collective; :meth:`Checkpointer.save`), after the
        strategy has checked the exchange that made these parameters (:meth:`Strategy.check_exchange`)."""
        self.strategy.check_exchange()
        return self.checkpointer.save(self.step, self.train_seconds, self.model, self.optimizer, self.sampler,
                                      at_mark, self._fraction_for(self.step))

    def _fraction_for(self, step: int) -> float | None:
        """The budget fraction the schedule reads at ``step`` (what a run resumed there must read):
        the one ``prepare`` used if it already ran for that step (a save inside the step, or after a
        stop that did not take it), else the latest agreed one."""
        prepared_step, fraction = self._prepared
        return fraction if prepared_step == step else self.budget_fraction

    def _resumed_fraction(self, state: dict) -> float:
        """The budget fraction a resumed run starts from: the checkpoint's agreed one, rescaled
        when the budget changed (``budget_minutes``); from its training seconds when the run it
        comes from had no budget."""
        saved, minutes = state.get("budget_fraction"), state.get("budget_minutes")
        if saved is None or not minutes:
            return self._fraction_of(self.train_seconds)
        return float(saved) * float(minutes) / float(self.cfg.train.max_minutes)

    def _fraction_of(self, seconds: float) -> float:
        """``seconds`` of training as a fraction of the time budget (``train.max_minutes`` > 0)."""
        return seconds / (60.0 * self.cfg.train.max_minutes)

    def _make_viewer(self):
        """``viewer.enabled``: the live web viewer, served by the main rank (see :class:`LiveViewer`);
        where a frame needs every rank (``strategy.live_view_collective``), the others follow."""
        if not self.cfg.viewer.enabled or not (self.env.is_main or self.strategy.live_view_collective):
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

    # ----------------------------------------------------------------- loop
    def train_step(self, step: int):
        """The step's forward half: returns (batch, model outputs, summed squared error)."""
        with self.timer.phase("input_wait"):  # sync builds the batch here; pipelined waits for a worker
            batch = self.sampler.host_batch(step)
        with self.timer.phase("copy"):
            batch = self.sampler.to_device(batch)
        with self.timer.phase("model_update"):
            self._prepared = (step, self.budget_fraction)
            if self.step_fn.prepare(step, self.budget_fraction):  # parameters replaced: the wrapper is rebuilt too
                self.wrapped = self.strategy.rewrap()
        with self.timer.phase("forward"):
            out, sse = self.step_fn.forward(self.wrapped, batch)
        return batch, out, sse

    def agree(self, batch, sse: torch.Tensor) -> StepAgreement:
        """The step's one small all-reduce: global valid rays, stop and checkpoint flags.

        It reads nothing from the device when the batch was built on the host (its valid count was
        taken there, ``RayBatch.num_valid``) or every ray is valid (no ray filter: the count is
        the batch size), and the model's flags are host values: the non-finite-loss flag is the
        *previous* step's (:class:`~.late_flag.LateFlag`), so a non-finite loss at step k stops
        every rank at step k + 1's agreement, before step k + 1's update. Nothing is lost by the
        step's delay: the run stops without saving either way, and every point that would keep the
        parameters of step k (a ``ckpt_every`` checkpoint, validation, the final checkpoint) first
        settles the flag (:meth:`_settle_nonfinite`, a collective at a step every rank reaches);
        a time-mark checkpoint is taken after the agreement that carried step k's flag.
        """
        if batch.num_valid is not None:  # counted on the host before the copy
            valid = batch.num_valid
        else:  # a batch built on the device (sampler=device): its count is on the device too
            valid = float(batch.valid.shape[0]) if self.sampler.every_ray_valid else batch.valid.sum()
        nonfinite, self._late_step = self._late_nonfinite.swap(~torch.isfinite(sse.detach())), self.step
        local = StepStats(valid_rays=valid, nonfinite=nonfinite,
                          over_budget=float(0 < self.cfg.train.max_minutes * 60.0 <= self.train_seconds),
                          at_mark=float(self.checkpointer.mark_passed(self.train_seconds)),
                          signal=float(self.stop.requested), collapsed=float(bool(self.model.collapsed())),
                          train_seconds=self.train_seconds,
                          live_frame=float(self.viewer is not None and self.viewer.wants_frame()))
        with self.timer.phase("step_sync"):
            agreed = self.strategy.reduce_step_stats(local)
        if self.budget_fraction is not None:  # the mean over ranks: the same float everywhere (one all-reduce)
            self.budget_fraction = self._fraction_of(agreed.total.train_seconds / self.env.world_size)
        return agreed

    def _settle_nonfinite(self) -> None:
        """Read the non-finite flag the last agreement did not carry and stop (without saving) if
        any rank's loss was non-finite: before anything keeps the current parameters. Collective:
        every rank calls it at the same step (every rank swaps the flag at every step, so ``pending``
        is the same on all)."""
        if not self._late_nonfinite.pending:
            return
        ranks = self.strategy.sum_over_ranks([self._late_nonfinite.take()])[0]
        if ranks:
            self._stop_nonfinite(ranks, self._late_step)

    def fit(self) -> dict:
        """Train until ``train.max_steps``, the time budget or a stop signal, then evaluate the test split."""
        max_steps, log_every, val_every = step_limit(self.cfg.train), self.cfg.train.log_every, self.cfg.train.val_every
        progress, stop_reason, segment_start = self._progress(max_steps), "max_steps", self.train_seconds
        loop_start = time.perf_counter()
        while self.step < max_steps:
            start = time.perf_counter()
            self.timer.begin_step()
            batch, out, sse = self.train_step(self.step)
            agreed = self.agree(batch, sse)
            flags = agreed.total
            if flags.nonfinite:  # the previous step's loss (agree's docstring)
                self._stop_nonfinite(flags.nonfinite, self.step - 1)
            if flags.collapsed:
                self._stop_collapsed(flags)
            if flags.over_budget or flags.signal:  # every rank leaves at this step
                stop_reason = "time_budget" if flags.over_budget else "signal"
                self.timer.cancel_step()  # the begun step is not taken: no record of it
                break
            if flags.at_mark:  # some rank passed a time mark: everyone saves at this step
                with self.timer.phase("checkpoint"):
                    self.save_checkpoint(at_mark=True)
            self.step_fn.update(sse / agreed.loss_normalizer)
            self.step += 1
            done = self.profiler.end_step(self.step - 1, agreed.mine.valid_rays, out.num_samples,
                                          self.strategy.step_comm())  # after the step's GPU work (CUDA: its sync)
            step_seconds = done - start
            self.train_seconds += step_seconds
            if self.step % log_every == 0 or self.step == max_steps:
                self._log_step(out, batch, flags.valid_rays, agreed.mine.valid_rays, step_seconds, progress)
            if progress is not None:
                progress.update(1)
            if val_every and self.step % val_every == 0:
                self.timer.mark("evaluate")  # outside the step: named for hang reports, not timed
                self._settle_nonfinite()
                self.validate()
            if self.checkpointer.due(self.step):
                self.timer.mark("checkpoint")  # its barrier waits for every rank
                self._settle_nonfinite()
                self.save_checkpoint()
            if self.viewer is not None:  # between steps, in this thread: the model is not changing
                self.viewer.after_step(self.model, self.step, float(flags.valid_rays) / max(step_seconds, 1e-9),
                                       frame_agreed=bool(flags.live_frame))
        return self._finish(stop_reason, progress, segment_start, time.perf_counter() - loop_start)

    def _stop_nonfinite(self, ranks: float, step: int) -> None:
        """Stop without saving: ``ranks`` ranks had a non-finite loss at ``step``."""
        msg = f"non-finite loss at step {step} on {int(ranks)} rank(s); stopping without saving"
        self._stop_without_saving(NonFiniteLoss(msg), {"event": "nonfinite_loss"})

    def _stop_without_saving(self, err: NonFiniteLoss, row: dict) -> None:
        """Log ``err``'s message and the event ``row`` at this step, close, raise ``err`` (no checkpoint)."""
        log.error(str(err))
        self.logger.log({"step": self.step, **row})
        self.close()
        raise err

    def _stop_collapsed(self, flags: StepStats) -> None:
        """Stop like a non-finite loss when a model's occupancy grid emptied (nothing is sampled
        any more, so nothing can learn again): no checkpoint of the collapsed model."""
        mine = self.model.collapsed()
        msg = (f"training collapsed at step {self.step} on {int(flags.collapsed)} rank(s)"
               f"{' (here: ' + ', '.join(mine) + ' is empty)' if mine else ''}: every occupancy cell fell below "
               f"model.occupancy_threshold, so no sample is marched any more. Likely cause: a learning rate too "
               f"high for this model (train.lr={self.cfg.train.lr}) or a too-high occupancy_threshold; "
               f"stopping without saving")
        self._stop_without_saving(TrainingCollapse(msg), {"event": "occupancy_collapse", "parts": mine})

    def _finish(self, stop_reason: str, progress, segment_start: float, loop_wall_s: float) -> dict:
        """After the loop (``loop_wall_s``: its wall seconds in this process, validation, checkpoints
        and the live viewer's frames included): profile summaries, the final checkpoint, the test split."""
        if progress is not None:
            progress.close()
        self.timer.mark("evaluate")  # final checkpoint, summaries and the test split (hang reports)
        self.sampler.close()  # workers are not needed for evaluation; its state (next step) stays
        self._settle_nonfinite()  # before the final checkpoint (collective)
        summaries = self.strategy.gather(self.profiler.finish())  # collective: every rank's breakdown to all
        sizes = self.strategy.gather(self._model_size())  # collective: every rank's parameters and peak memory
        if self.env.is_main:
            log_profile_summaries(summaries, self.logger, self.step)
            log.info("training stopped at step %d (%s) after %.1f s of training (%.1f s of wall time in the loop "
                     "this session: validation, checkpoints and the viewer included)", self.step, stop_reason,
                     self.train_seconds, loop_wall_s)
            self._log_input_summary(self.train_seconds - segment_start)
            self._log_model_size(sizes)
        if self.checkpointer.final_wanted(stop_reason):
            saved = self.save_checkpoint()
            if stop_reason == "signal" and self.env.is_main:
                log.warning("stopped by %s at step %d: checkpoint %s written; continue with resume=true",
                            self.stop.signal or "a signal on another rank", self.step, saved)
                self.logger.log({"step": self.step, "event": "signal_stop", "signal": self.stop.signal})
        metrics = self.evaluate() if self.cfg.eval.enabled and stop_reason != "signal" else {}
        self.close()
        return {"step": self.step, "stop_reason": stop_reason, **metrics}

    def _log_input_summary(self, wall: float) -> None:
        """Share of the steps' wall time (``wall`` s, this run segment) spent waiting for input and copying it."""
        totals, wall = self.timer.run_totals, max(wall, 1e-9)
        wait, copy = totals.get("input_wait", 0.0), totals.get("copy", 0.0)
        log.info("input (sampler=%s): waited %.2f s (%.1f%% of %.1f s of steps), copied %.2f s (%.1f%%)",
                 self.sampler.name, wait, 100 * wait / wall, wall, copy, 100 * copy / wall)
        self.logger.log({"step": self.step, "event": "input_summary", "sampler": self.sampler.name,
                         "input_wait_s": wait, "copy_s": copy, "steps_s": wall,
                         "input_wait_share": wait / wall, "copy_share": copy / wall})

    def _model_size(self) -> dict:
        """This rank's parameters (the model it holds and trains: ``ss``, its own regions with their
        context tables) and the process's peak resident memory (``VmHWM``), on CUDA peak device memory."""
        row = {"parameters": sum(p.numel() for p in self.model.parameters()),
               **self.strategy.parameter_report(self.model)}
        peak = peak_rss_mb()
        if peak is not None:
            row["peak_rss_mb"] = peak
        if self.device.type == "cuda":
            row["peak_device_memory_mb"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        return row

    def _log_model_size(self, sizes: list[dict]) -> None:
        """The ``model_size`` event: the largest rank's figures (``parameters_per_rank``,
        ``peak_rss_mb``, ``peak_device_memory_mb``), each rank's (``ranks``) and, under ``ss``, the
        parameters of every region (``parameters_per_region``)."""
        row = {"step": self.step, "event": "model_size", "parameters_per_rank": max(s["parameters"] for s in sizes),
               "parameters_total": sum(s["parameters"] for s in sizes),
               "ranks": [{k: v for k, v in s.items() if k != "regions"} for s in sizes]}
        for key in ("peak_rss_mb", "peak_device_memory_mb"):
            if all(key in s for s in sizes):
                row[key] = max(s[key] for s in sizes)
        regions = {k: v for s in sizes for k, v in s.get("regions", {}).items()}
        if regions:
            row["parameters_per_region"] = {k: regions[k] for k in sorted(regions, key=int)}
        log.info("model: %s parameters per rank (%d in all); peak RSS per rank %s MiB",
                 [s["parameters"] for s in sizes], row["parameters_total"],
                 [round(s.get("peak_rss_mb", float("nan"))) for s in sizes])
        self.logger.log(row)

    def _progress(self, max_steps: float):
        if not self.env.is_main or not self.cfg.train.progress:
            return None
        from tqdm import tqdm

        return tqdm(total=None if math.isinf(max_steps) else max_steps, initial=self.step, dynamic_ncols=True,
                    desc="train")

    def _log_step(self, out, batch, global_valid, local_valid, step_seconds, progress):
        target = batch.rgb[out.ray_index] if out.ray_index is not None else batch.rgb  # ss: (ray, region) rows
        err = ((out.rgb.detach().float() - target) ** 2).mean(dim=-1)
        if out.loss_weight is not None:  # ss on the sync-free path: rows of rays a region did not train on weigh 0
            keep = (out.loss_weight > 0).to(err.dtype)
            mse = float((err * keep).sum() / keep.sum().clamp(min=1))
        else:
            mse = float(err.mean()) if len(target) else 0.0
        row = {"step": self.step, "loss": mse, "psnr": -10 * math.log10(max(mse, 1e-10)),
               "rays_per_s": global_valid / max(step_seconds, 1e-9), "samples_per_ray":
               out.num_samples / max(len(batch.rgb), 1), "lr": self.optimizer.param_groups[0]["lr"],
               "train_seconds": self.train_seconds,
               **({} if self.budget_fraction is None else {"budget_fraction": self.budget_fraction}),
               **{f"time_{k}": v for k, v in self.timer.pop().items()}, **self.strategy.comm_stats(),
               **self.timer.recent_figures(self.cfg.train.log_every)}
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
            mine = {**self.timer.rank_figures(self.cfg.train.log_every), "peak_rss_mb": peak_rss_mb(),
                    "rays_per_s": float(local_valid) / max(step_seconds, 1e-9)}
            for r, figs in enumerate(self.strategy.gather(mine)):
                row.update({f"rank{r}/{k}": v for k, v in figs.items()})
        self.logger.log(row)
        if progress is not None:
            progress.set_postfix(loss=f"{mse:.4f}", psnr=f"{row['psnr']:.2f}", rays_s=f"{row['rays_per_s']:.0f}")

    # ----------------------------------------------------------------- evaluation
    @property
    def _image_panels(self) -> bool:
        """Validation and test panels go to W&B (the same answer on every rank: it decides who writes PNGs)."""
        return self.cfg.logger.wandb.mode != "disabled" and self.cfg.logger.wandb.log_images

    def validate(self) -> None:
        start = time.perf_counter()
        out_dir = self.run_dir / "val" / f"step_{self.step:08d}" if self._image_panels else None
        res = make_eval_split(self.cfg, self.model, self.strategy)("val", self.cfg.train.val_views, 1, out_dir, None)
        psnrs = [r["psnr"] for r in res["rows"]]
        self.logger.log({"step": self.step, "val_psnr": sum(psnrs) / len(psnrs),
                         "val_seconds": time.perf_counter() - start})
        if out_dir is not None and self.env.is_main:
            self.logger.log_images(self.step, image_panels(res["scene"], res["rows"], out_dir, "val"))

    def evaluate(self) -> dict:
        """Test-split PSNR/SSIM(/LPIPS); renders under ``RUN/test/``; ``metrics.json`` on rank 0; with W&B
        images, the first :data:`TEST_PANELS` test views as panels."""
        metrics = evaluate_run(self.cfg, self.model, self.strategy, self.run_dir, self.step,
                               make_eval_split(self.cfg, self.model, self.strategy))
        if self._image_panels and self.env.is_main:
            scene, rows = metrics.pop("scene"), metrics.pop("rows")
            self.logger.log_images(self.step, image_panels(scene, rows[:TEST_PANELS], self.run_dir / "test", "test"))
        return {k: v for k, v in metrics.items() if k not in ("scene", "rows")}

    def close(self) -> None:
        self.sampler.close()
        self.logger.close()
        if self.viewer is not None:
            self.viewer.close()
            self.viewer = None
