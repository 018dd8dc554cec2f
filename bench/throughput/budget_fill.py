"""The static step's sample budget at lego's final grid stage: how full its slots are for a batch of R rays
(issue 62 item 5), on the CPU with the CUDA paths forced (``distnerf.host_buffers.sync_free_paths``).

    python -m bench.throughput.budget_fill RUN_DIR [--rays 4096 16384] [--steps 6] [--samples 262144]
        [--out bench/throughput/results/budget_fill/budget_fill.json]

``RUN_DIR``: a finished lego run (``bench/quality/quality.sh``: its newest checkpoint is past the grid's last
stage). For each R, the run's checkpoints are hard-linked into a scratch run directory and the real
:class:`~distnerf.engine.trainer.Trainer` resumes from the newest one with ``train.rays_per_rank=R`` and
``step.samples_per_step=P`` (the static step; the train section is not in the resume hashes), then trains
``--steps`` steps with the CUDA paths forced. The budget's figures (``SampleBudget.metrics``: read a step late)
after each step from the second on: ``budget_fill`` (samples needed / P), samples per active ray, active and
overflowed rays. The figure is the median fill over those steps, with its min and max. Counts, not times:
the machine's load does not change them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from bench.common import ROOT, finish_meta, start_meta


def fill_at(run_dir: Path, rays: int, samples: int, steps: int) -> dict:
    """Resume ``run_dir``'s newest checkpoint with R = ``rays`` and P = ``samples``; the budget's figures."""
    import torch
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from bench.throughput.syncs import run_step
    from distnerf import distributed as D
    from distnerf.config_check import validate
    from distnerf.engine.trainer import Trainer
    from distnerf.host_buffers import sync_free_paths
    from distnerf.strategy import build_strategy

    saved = OmegaConf.load(run_dir / "config.yaml")
    with tempfile.TemporaryDirectory(prefix="budget_fill_") as tmp:
        scratch = Path(tmp) / "run"
        for f in sorted((run_dir / "checkpoints").rglob("*")):
            dst = scratch / "checkpoints" / f.relative_to(run_dir / "checkpoints")
            if f.is_dir():
                dst.mkdir(parents=True, exist_ok=True)
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.link(f, dst)
        overrides = ["dataset=blender", f"dataset.root={saved.dataset.root}", f"run_dir={scratch}", "resume=true",
                     f"train.rays_per_rank={rays}", f"step.samples_per_step={samples}",
                     "eval.enabled=false", "monitor.progress=false", "checkpoints.every=-1", "logger.wandb.mode=disabled",
                     "profiler.telemetry=false", "train.max_steps=1000000", "monitor.log_every=1000000"]
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cfg = validate(compose("train", overrides=overrides))
        env = D.init_distributed("cpu", timeout_s=cfg.dist_timeout_s, setup_timeout_s=cfg.dist_setup_timeout_s)
        trainer = Trainer(cfg, build_strategy(cfg.strategy, env), scratch)
        try:
            resumed, figures = trainer.step, []
            if resumed == 0:
                raise SystemExit(f"{run_dir}: no checkpoint to resume from")
            with sync_free_paths(True):
                for _ in range(steps):
                    run_step(trainer)
                    figures.append(trainer.train_step.budget_metrics())
            figures = [f for f in figures if f]  # the first step has nothing to report yet
            fill = [f["budget_fill"] for f in figures]
            return {"rays_per_rank": rays, "samples_per_step": samples, "resumed_step": resumed,
                    "grid_resolution": int(trainer.model.grid_resolution), "steps": figures,
                    "fill": {"median": statistics.median(fill), "min": min(fill), "max": max(fill), "n": len(fill)},
                    "samples_per_ray": statistics.median(f["budget_samples_per_ray"] for f in figures),
                    "torch_threads": torch.get_num_threads()}
        finally:
            trainer.close()
            D.shutdown(env)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--rays", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--samples", type=int, default=1 << 18)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/throughput/results/budget_fill/budget_fill.json")
    args = ap.parse_args(argv)
    if not (args.run_dir / "checkpoints").is_dir():
        raise SystemExit(f"{args.run_dir}: no checkpoints folder (a finished lego run of bench/quality/quality.sh)")
    meta = start_meta()
    rows = [fill_at(args.run_dir, r, args.samples, args.steps) for r in args.rays]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "meta": finish_meta(meta)}, indent=1) + "\n")
    for r in rows:
        print(f"R {r['rays_per_rank']}: fill {r['fill']['median']:.3f} ({r['fill']['min']:.3f}-{r['fill']['max']:.3f}), "
              f"{r['samples_per_ray']:.1f} samples per active ray, grid {r['grid_resolution']}^3, step {r['resumed_step']}")


if __name__ == "__main__":
    main()
