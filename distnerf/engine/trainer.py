"""The trainer: wires components in dependency order and runs the loop.

Data flow of one step: dataset -> sampler.host_batch(step) (waits for the
pipelined workers) -> sampler.to_device (pinned, non-blocking) ->
strategy-wrapped model forward (the whole render) -> photometric loss ->
backward (gradient all-reduce inside DDP) -> optimizer -> metrics -> checkpoint.
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
from ..data import load_scene
from ..data.base import SceneData
from ..observe.logger import JsonlLogger, MultiLogger, NullLogger, WandbLogger
from ..observe.metrics import LPIPS, LPIPS_BACKBONE
from ..observe.profiler import RunProfiler, log_profile_summaries
from ..sampler import batch_config, build_sampler, pixel_source
from ..strategy.base import Strategy
from .evaluate import evaluate_views, select_views
from .loss import photometric_sse
from .optim import build_optimizer, rebuild_optimizer, set_lr

log = logging.getLogger("distnerf")


class NonFiniteLoss(RuntimeError):
    """Training stopped because a rank's loss was NaN or infinite."""


class Trainer:
    """Builds dataset, sampler, model, optimizer and checkpointer for one rank.

    Args:
        cfg: the composed config (``conf/train.yaml``).
        strategy: the strategy, already holding this process's :class:`DistEnv`.
        run_dir: the run directory shared by every rank.
        stop: set by SIGUSR1/SIGTERM (:class:`distnerf.dist.StopRequest`); any rank's request
            stops every rank at the same step with a checkpoint. ``None``: signals are not handled.
    """

    def __init__(self, cfg: DictConfig, strategy: Strategy, run_dir: Path, stop: D.StopRequest | None = None):
        self.cfg, self.strategy, self.env, self.run_dir = cfg, strategy, strategy.env, Path(run_dir)
        self.stop = stop if stop is not None else D.StopRequest()
        self.ckpt_root = self.run_dir / "checkpoints"
        self.device = self.env.device
        self.train_cfg = OmegaConf.to_container(cfg.train, resolve=True)
        D.seed_everything(int(cfg.seed))  # identical model initialisation on every rank
        dataset_cfg = OmegaConf.to_container(cfg.dataset, resolve=True)
        # sampler.cache_dir: pixels decoded image by image into a memory-mapped cache, never all in RAM
        self.train_scene = load_scene(dataset_cfg, "train", pixels=pixel_source(cfg.sampler))
        self.rays_per_rank = strategy.rays_per_rank(int(cfg.train.global_rays))
        model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
        strategy.prepare(self.train_scene, self.run_dir, int(cfg.seed), model_cfg)  # ss: the partition
        self.sampler = build_sampler(OmegaConf.to_container(cfg.sampler, resolve=True), self.train_scene,
                                     self.rays_per_rank, int(cfg.seed), strategy.sampler_stream(), self.device,
                                     strategy.ray_filter(self.train_scene))
        self.model = strategy.build_model(model_cfg, self.train_scene)
        if model_cfg.get("compile"):  # in place, so DDP re-wraps keep it; compile time reported by the profiler
            self.model.compile(mode=model_cfg.get("compile_mode"))
        self.hashes = ckpt.config_hashes(OmegaConf.to_container(cfg, resolve=True))
        # which rays are drawn (not how fast): resume refuses a change
        self.hashes.update(ckpt.config_hashes({"sampler": batch_config(cfg.sampler)}, ("sampler",)))
        self.step, self.train_seconds = 0, 0.0
        resume_from = self._find_resume()
        state = None
        if resume_from is not None:
            state = strategy.load_model_state(resume_from, self.model)
        self.wrapped = strategy.wrap(self.model)
        self.optimizer = build_optimizer(self.model, self.train_cfg)
        if state is not None:
            self._restore(resume_from, state)
        self.sampler.start(self.step)  # batches are drawn by step index: prefetch from here
        profiler_cfg = cfg.get("profiler")  # always-on step breakdown (+ traces with profiler=trace)
        self.profiler = RunProfiler(OmegaConf.to_container(profiler_cfg, resolve=True) if profiler_cfg else {},
                                    self.device, self.env.rank, self.env.world_size, self.run_dir, self.model)
        self.timer = self.profiler.steps
        self.logger = self._make_logger(resume_from is not None)
        if resume_from is not None:
            self.logger.log({"step": self.step, "event": "resumed", "checkpoint": resume_from.name,
                             "torchrun_restart": self.env.restart_count})
        if self.env.is_main:
            log.info("global batch %d rays: %s; lr %.3g (per-group multipliers from the model; not scaled "
                     "with the world size since the global batch is fixed)", cfg.train.global_rays,
                     strategy.describe_batch(int(cfg.train.global_rays)), cfg.train.lr)

    # ----------------------------------------------------------------- resume
    def _find_resume(self) -> Path | None:
        restarted = self.env.restart_count > 0  # torchrun restarted the worker group: always continue
        if not (self.cfg.get("resume", False) or restarted):
            return None
        if restarted and self.env.is_main:
            log.info("torchrun restart %d: resuming from the newest committed checkpoint", self.env.restart_count)
        found = ckpt.latest(self.ckpt_root)
        if found is None:
            log.info("resume=true but no committed checkpoint in %s: starting fresh", self.ckpt_root)
            return None
        manifest = ckpt.read_manifest(found, verify=True)
        ckpt.check_compatible(manifest, self.hashes, found)
        if manifest["world_size"] != self.env.world_size:
            log.warning("resuming %s saved at world size %d on world size %d: the continuation is not "
                        "bit-exact (ray streams and RNG states differ)", found, manifest["world_size"],
                        self.env.world_size)
        return found

    def _restore(self, path: Path, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.train_seconds = int(state["step"]), float(state.get("train_seconds", 0.0))
        rank_file = path / f"rank_{self.env.rank}.pt"
        if rank_file.exists():
            rank_state = torch.load(rank_file, map_location="cpu", weights_only=False)
            D.set_rng_state(rank_state["rng"])
            if "sampler" in rank_state:
                self._restore_sampler(rank_state["sampler"], rank_file)
        if self.env.is_main:
            log.info("resumed from %s at step %d", path, self.step)

    def _restore_sampler(self, saved: dict, rank_file: Path) -> None:
        """Continue the batch stream at ``self.step``; warn when what is drawn changed."""
        now = self.sampler.state_dict()
        changed = [k for k in ("seed", "stream", "rays_per_batch", "policy") if saved.get(k) != now.get(k)]
        if changed:
            log.warning("%s: sampler %s differ from the checkpoint's (%s vs %s): the continuation draws other "
                        "batches than the uninterrupted run", rank_file, ", ".join(changed),
                        {k: now.get(k) for k in changed}, {k: saved.get(k) for k in changed})
        if saved["next_step"] != self.step:
            log.warning("%s: sampler state at step %d, model at step %d: drawing from step %d", rank_file,
                        saved["next_step"], self.step, self.step)
        self.sampler.load_state_dict({**saved, "next_step": self.step})

    def save_checkpoint(self) -> Path:
        """Write ``step_N/``: model + optimizer (as the strategy shards them), RNG and sampler state per
        rank, then the manifest."""
        d = ckpt.step_dir(self.ckpt_root, self.step)
        d.mkdir(parents=True, exist_ok=True)
        # ddp: the main rank writes one model.pt; ss: every rank its regions' files
        self.strategy.save_model_state(d, self.model, self.optimizer,
                                       {"step": self.step, "train_seconds": self.train_seconds})
        # the next batch is the one of self.step even when a stop came after drawing it (signal, time budget)
        ckpt.atomic_torch_save({"rng": D.rng_state(), "rank": self.env.rank,
                                "sampler": {**self.sampler.state_dict(), "next_step": self.step}},
                               d / f"rank_{self.env.rank}.pt")
        self.strategy.barrier()  # every rank's files are complete before the manifest commits them
        if self.env.is_main:
            ckpt.write_manifest(d, self.step, self.env.world_size, self.hashes, self.strategy.manifest_extra())
            ckpt.prune(self.ckpt_root, int(self.train_cfg.get("keep_checkpoints", 2)))
        return d

    # ----------------------------------------------------------------- logging
    def _make_logger(self, resumed: bool):
        if not self.env.is_main:
            return NullLogger()
        loggers = [JsonlLogger(self.run_dir / "metrics.jsonl", self.step if resumed else None)]
        wandb_cfg = OmegaConf.to_container(self.cfg.logger.wandb, resolve=True)
        if wandb_cfg.get("mode", "disabled") != "disabled":
            loggers.append(WandbLogger(wandb_cfg, self.run_dir, OmegaConf.to_container(self.cfg, resolve=True),
                                       resumed))
        return MultiLogger(loggers)

    # ----------------------------------------------------------------- loop
    def train_step(self, step: int):
        """One step; returns (sse, reduced stats tensor, outputs, valid count)."""
        with self.timer.phase("input_wait"):  # sync builds the batch here; pipelined waits for a worker
            batch = self.sampler.host_batch(step)
        with self.timer.phase("copy"):
            batch = self.sampler.to_device(batch)
        with self.timer.phase("model_update"):
            if self.model.update_state(step):  # parameters replaced: rewrap and rebuild optimizer state
                self.wrapped = self.strategy.rewrap()
                self.optimizer = rebuild_optimizer(self.optimizer, self.model, self.train_cfg)
            set_lr(self.optimizer, step, self.train_cfg)
            generator = torch.Generator(self.device).manual_seed(batch.jitter_seed)
        use_bf16 = bool(self.train_cfg.get("bf16", False)) and self.device.type == "cuda"
        with self.timer.phase("forward"):
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=use_bf16):
                out = self.wrapped(batch.rays, generator)
            sse = photometric_sse(out, batch.rgb, batch.valid)
        return batch, out, sse

    def fit(self) -> dict:
        """Train until ``train.max_steps`` or the time budget, then evaluate the test split."""
        max_steps = int(self.train_cfg["max_steps"])
        budget = float(self.train_cfg.get("max_minutes") or 0) * 60.0
        log_every, val_every = int(self.train_cfg.get("log_every", 50)), int(self.train_cfg.get("val_every", 0))
        ckpt_every = int(self.train_cfg.get("ckpt_every", 0))
        # checkpoints at training-time marks (minutes), e.g. quality-vs-time benchmarks
        marks = sorted(float(m) * 60.0 for m in self.train_cfg.get("ckpt_minutes") or [])
        marks = [m for m in marks if m > self.train_seconds]
        progress = self._progress(max_steps)
        stop_reason = "max_steps"
        segment_start = self.train_seconds
        while self.step < max_steps:
            start = time.perf_counter()
            self.timer.begin_step()
            batch, out, sse = self.train_step(self.step)
            over_budget = budget > 0 and self.train_seconds >= budget
            at_mark = bool(marks) and self.train_seconds >= marks[0]
            finite = bool(torch.isfinite(sse))
            # one all-reduce per step: global valid rays (loss normaliser) + stop, checkpoint and signal flags
            with self.timer.phase("step_sync"):
                stats = self.strategy.reduce_step_stats(torch.tensor(
                    [float(batch.valid.sum()), float(not finite), float(over_budget), float(at_mark),
                     float(self.stop.requested)], dtype=torch.float64))
            if stats[1] > 0:
                msg = f"non-finite loss at step {self.step} on {int(stats[1])} rank(s); stopping without saving"
                log.error(msg)
                self.logger.log({"step": self.step, "event": "nonfinite_loss"})
                self.close()
                raise NonFiniteLoss(msg)
            if stats[2] > 0:
                stop_reason = "time_budget"
                break
            if stats[4] > 0:  # a rank got SIGUSR1/SIGTERM (preemption, scancel): all stop and checkpoint here
                stop_reason = "signal"
                break
            if stats[3] > 0:  # some rank passed a time mark: everyone saves at this step
                marks.pop(0)
                with self.timer.phase("checkpoint"):
                    self.save_checkpoint()
            loss = sse / self.strategy.loss_normalizer(float(stats[0]))
            with self.timer.phase("backward"):  # DDP waits for the gradient all-reduce inside
                loss.backward()
            with self.timer.phase("regularizer"):
                self.model.add_regularizer_grads_()  # identical on every rank: added after the all-reduce
            with self.timer.phase("optimizer"):
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            self.step += 1
            step_seconds = time.perf_counter() - start
            self.profiler.end_step(self.step - 1, float(batch.valid.sum()), out.get("num_samples", 0),
                                   self.strategy.step_comm())
            self.train_seconds += step_seconds
            if self.step % log_every == 0 or self.step == max_steps:
                self._log_step(out, batch, float(stats[0]), step_seconds, progress)
            if progress is not None:
                progress.update(1)
            if val_every and self.step % val_every == 0:
                self.validate()
            if ckpt_every > 0 and self.step % ckpt_every == 0:
                self.save_checkpoint()
        if progress is not None:
            progress.close()
        self.sampler.close()  # workers are not needed for evaluation; its state (next step) stays
        summaries = self.strategy.gather(self.profiler.finish())  # collective: every rank's breakdown to all
        if self.env.is_main:
            log_profile_summaries(summaries, self.logger, self.step)
        if self.env.is_main:
            log.info("training stopped at step %d (%s) after %.1f s of training", self.step, stop_reason,
                     self.train_seconds)
            self._log_input_summary(self.train_seconds - segment_start)
        if ckpt_every >= 0 or stop_reason == "signal":
            saved = self.save_checkpoint()
            if stop_reason == "signal" and self.env.is_main:
                log.warning("stopped by %s at step %d: checkpoint %s written; continue with resume=true",
                            self.stop.signal or "a signal on another rank", self.step, saved)
                self.logger.log({"step": self.step, "event": "signal_stop", "signal": self.stop.signal})
        metrics = self.evaluate() if self.cfg.eval.get("enabled", True) and stop_reason != "signal" else {}
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

    def _progress(self, max_steps: int):
        if not self.env.is_main or not self.train_cfg.get("progress", True):
            return None
        from tqdm import tqdm

        return tqdm(total=max_steps, initial=self.step, dynamic_ncols=True, desc="train")

    def _log_step(self, out, batch, global_valid, step_seconds, progress):
        target = batch.rgb[out["ray_index"]] if "ray_index" in out else batch.rgb  # ss: (ray, region) rows
        mse = float(((out["rgb"].detach().float() - target) ** 2).mean()) if len(target) else 0.0
        row = {"step": self.step, "loss": mse, "psnr": -10 * math.log10(max(mse, 1e-10)),
               "rays_per_s": global_valid / max(step_seconds, 1e-9), "samples_per_ray":
               out.get("num_samples", 0) / max(len(batch.rgb), 1), "lr": self.optimizer.param_groups[0]["lr"],
               "train_seconds": self.train_seconds,
               **{f"time_{k}": v for k, v in self.timer.pop().items()}, **self.strategy.comm_stats(),
               **self.timer.recent_figures(self.train_cfg.get("log_every", 50))}
        for key, name in (("num_density_samples", "density_samples_per_ray"),
                          ("num_colour_samples", "colour_samples_per_ray")):
            if key in out:  # packed engine: density evaluations (both passes) and coloured samples
                row[name] = out[key] / max(len(batch.rgb), 1)
        grid_res = getattr(self.model, "resolution", None)
        if grid_res is not None:
            row["grid_resolution"] = grid_res
        self.logger.log(row)
        if progress is not None:
            progress.set_postfix(loss=f"{mse:.4f}", psnr=f"{row['psnr']:.2f}", rays_s=f"{row['rays_per_s']:.0f}")

    # ----------------------------------------------------------------- evaluation
    def validate(self) -> None:
        start = time.perf_counter()
        res = make_eval_split(self.cfg, self.model, self.strategy)("val", int(self.train_cfg.get("val_views", 2)),
                                                                   1, None, None)
        psnrs = [r["psnr"] for r in res["rows"]]
        self.logger.log({"step": self.step, "val_psnr": sum(psnrs) / len(psnrs),
                         "val_seconds": time.perf_counter() - start})

    def evaluate(self) -> dict:
        """Test-split PSNR/SSIM(/LPIPS); renders under ``RUN/test/``; ``metrics.json`` on rank 0."""
        return evaluate_run(self.cfg, self.model, self.strategy, self.run_dir, self.step,
                            make_eval_split(self.cfg, self.model, self.strategy))

    def close(self) -> None:
        self.sampler.close()
        self.logger.close()


def make_eval_split(cfg, model, strategy):
    """A function ``(split, num_views, downscale, out_dir, lpips) -> {"scene", "rows"}`` that
    renders this rank's share of the views with the unwrapped model and gathers all rows."""

    def eval_split(split: str, num_views, downscale: int, out_dir: Path | None, lpips) -> dict:
        scene = load_scene(OmegaConf.to_container(cfg.dataset, resolve=True), split)
        if downscale > 1:
            scene = scene.downscaled(downscale)
        views = select_views(len(scene), num_views)
        mine = [views[i] for i in strategy.eval_views(len(views))]
        device = next(model.buffers()).device
        renderer = strategy.inference_model(model)  # ss: the fusion stage over every region
        rows = evaluate_views(renderer, scene, mine, int(cfg.eval.chunk), device,
                              out_dir if strategy.writes_renders else None, lpips)
        rows = strategy.gather_rows(rows)
        return {"scene": scene, "rows": rows}

    return eval_split


def evaluate_run(cfg, model, strategy, out_dir: Path, step: int, eval_split) -> dict:
    """Shared by training and ``distnerf.render``: evaluate the test split, write
    ``out_dir/metrics.json`` (main rank) and renders under ``out_dir/test/``."""
    eval_cfg = cfg.eval
    lpips = LPIPS() if eval_cfg.get("lpips", True) else None
    downscale = int(eval_cfg.get("downscale", 1))
    res = eval_split("test", eval_cfg.get("num_views"), downscale, Path(out_dir) / "test", lpips)
    rows, scene = res["rows"], res["scene"]
    mean = lambda k: sum(r[k] for r in rows) / len(rows)  # noqa: E731
    metrics = {
        "step": step, "psnr": mean("psnr"), "ssim": mean("ssim"),
        "lpips": mean("lpips") if lpips is not None and lpips.available else None,
        "lpips_backbone": LPIPS_BACKBONE,
        "lpips_reason": None if lpips is not None and lpips.available else (
            lpips.reason if lpips is not None else "disabled by eval.lpips=false"),
        "protocol": {"split": "test", "num_views": len(rows), "views": [r["name"] for r in rows],
                     "resolution": [scene.height, scene.width], "eval_downscale": downscale,
                     "background": [float(x) for x in scene.background], "psnr": "mean of per-image PSNR",
                     "ssim": "torchmetrics SSIM, gaussian 11x11, sigma 1.5, data range 1",
                     "dataset": str(scene.source)},
        "per_view": rows,
    }
    if strategy.is_main:
        (Path(out_dir) / "metrics.json").write_text(json.dumps(metrics, indent=1))
        log.info("test: PSNR %.2f dB, SSIM %.4f over %d views (%dx%d)", metrics["psnr"], metrics["ssim"],
                 len(rows), scene.height, scene.width)
    return {k: metrics[k] for k in ("psnr", "ssim", "lpips")}
