"""Is a capacity-study cell at its plateau? The same one-rank run at k times the steps, its schedule stretched k times.

    python -m bench.scaling.stretch OUT_DIR --budgets 31250,62500,125000,250000 --multiples 4 \
        [--steps 3000] [--set KEY=VALUE ...] [--name SUFFIX] [--collect] [--out bench/scaling/results/NAME/stretch.json]

The capacity study's plateau check (``distnerf/study/capacity.py::plateau_gain``) reads the last 20% of
a run's validation curve; under a learning rate that has already decayed (``optim.decay`` over
``optim.decay_steps``) that curve flattens whether or not the model holds all it can. This tool asks
the direct question: each budget (``model.max_params``) is trained at one rank for ``k x steps``
with the learning-rate decay (``optim.decay_steps``, 1500 by default) and the grid's stages
(``model.upsample_steps``, 200 and 600) stretched by ``k`` -- at ``k`` = W, one rank sees as many
rays as ``ddp`` at W ranks in ``steps``. A cell is at its plateau when the stretched run gains
less than the plateau threshold (0.2 dB) over it.

Every run: ``python -m distnerf.train dataset=synthetic dataset.kind=detail sampler=sync
train.global_rays=2048 monitor.val_views=4 eval.num_views=25 ... seed=0`` (the study's fixed
overrides; ``--set`` adds or replaces), run directory ``OUT_DIR/p<budget>_x<k>``. ``--collect``
trains nothing and summarises the run directories already in OUT_DIR. Writes JSON (``--out``)
with one row per run (budget, parameters, rays per step, steps, test PSNR / SSIM, constant-colour PSNR,
validation gain over the last 20% of the steps -- and, under a warmup-stable-decay schedule, over the
last 20% of its constant phase --, learning rate at 80% of the steps as a share of the first, the
validation curve) and a ``meta`` block. Untimed (quality at equal steps): no quiet machine needed.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


from bench.common import ROOT, default_out, start_meta, write_result

FIXED = ["dataset=synthetic", "dataset.kind=detail", "sampler=sync", "train.global_rays=2048", "monitor.val_views=4",
         "monitor.log_every=200", "checkpoints.every=0", "eval.num_views=25", "eval.lpips=false",
         "logger.wandb.mode=disabled", "monitor.progress=false", "strategy=ddp", "seed=0"]
DECAY_STEPS, UPSAMPLE_STEPS = 1500, (200, 600)  # the schema's defaults, stretched by k


def overrides(budget: int, k: int, steps: int, extra: list[str]) -> list[str]:
    """The training overrides of budget ``budget`` at ``k`` times ``steps``."""
    up = ",".join(str(k * u) for u in UPSAMPLE_STEPS)
    return [*FIXED, f"model.max_params={budget}", f"train.max_steps={k * steps}",
            f"optim.decay_steps={k * DECAY_STEPS}", f"model.upsample_steps=[{up}]",
            f"monitor.val_every={max(1, k * steps // 10)}", *extra]


def summarise(run_dir: Path) -> dict:
    """One run's row from its metrics.json, metrics.jsonl and config.yaml."""
    from omegaconf import OmegaConf

    from distnerf.config_check import global_batch, upgrade_config
    from distnerf.observe.logger import final_model_size
    from distnerf.study.capacity import lr_share, plateau_gain

    final = json.loads((run_dir / "metrics.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    cfg = upgrade_config(OmegaConf.load(run_dir / "config.yaml"))  # a run from before the train section's split too
    steps = int(cfg.train.max_steps)
    params = (final_model_size(rows) or {}).get("parameters_per_rank")
    strategy = cfg.strategy
    val = [(r["step"], r["val_psnr"]) for r in rows if "val_psnr" in r]
    return {"run": run_dir.name, "strategy": strategy.name, "training": strategy.get("training"),
            "num_regions": strategy.get("num_regions"), "tv_weight": float(cfg.model.tv_weight),
            "cubic_voxels": bool(cfg.model.get("cubic_voxels", False)),
            "max_params": int(cfg.model.max_params), "parameters_per_rank": params,
            "steps": steps, "decay": float(cfg.optim.decay), "decay_steps": None if cfg.optim.decay_steps is None else float(cfg.optim.decay_steps),
            "decay_start": float(cfg.optim.decay_start),
            "upsample_steps": list(cfg.model.upsample_steps), "psnr": final["psnr"], "ssim": final["ssim"],
            "constant_psnr": final.get("constant_psnr"), "num_views": final.get("num_scored_views"),
            "global_rays": global_batch(cfg.train, 1),  # one rank
            "val_gain_last_20pct": plateau_gain(val),
            # a warmup-stable-decay run (decay_steps null, decay < 1): the same gain over the last 20% of its
            # constant phase, before the cool-down begins (None for other schedules)
            "val_gain_before_decay": plateau_gain([(s, v) for s, v in val if s <= cfg.optim.decay_start * steps])
            if cfg.optim.decay_steps is None and float(cfg.optim.decay) < 1.0 else None,
            "val_curve": val,
            "lr_at_80pct_over_first": lr_share([(r["step"], r["lr"]) for r in rows if "lr" in r])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--budgets", default="31250,62500,125000,250000")
    ap.add_argument("--multiples", default="4")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--name", default="", help="a suffix of the run directories' names (several probes in one OUT_DIR)")
    ap.add_argument("--collect", action="store_true", help="train nothing: summarise the runs in OUT_DIR")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    meta = start_meta()
    if not args.collect:
        for budget in (int(b) for b in args.budgets.split(",")):
            for k in (int(m) for m in args.multiples.split(",")):
                run_dir = args.out_dir / f"p{budget}_x{k}{args.name}"
                cmd = [sys.executable, "-m", "distnerf.train", *overrides(budget, k, args.steps, args.set),
                       f"run_dir={run_dir}"]
                print(" ".join(cmd), flush=True)
                env = {**__import__("os").environ, "OMP_NUM_THREADS": str(args.threads)}
                subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    dirs = sorted(d for d in args.out_dir.iterdir() if (d / "metrics.json").is_file())
    if not dirs:
        raise SystemExit(f"bench_stretch: no finished run (metrics.json) under {args.out_dir}")
    rows = sorted((summarise(d) for d in dirs), key=lambda r: (r["max_params"], r["steps"], r["run"]))
    for r in rows:
        print(f"{r['run']}: {r['max_params']} params budget, {r['steps']} steps: PSNR {r['psnr']:.2f} dB, "
              f"val gain over the last 20% {r['val_gain_last_20pct']:+.3f} dB, lr at 80% x{r['lr_at_80pct_over_first']:.3f}")
    write_result(args.out or default_out(__file__, f"{args.out_dir.name}/stretch.json"), {"rows": rows}, meta)


if __name__ == "__main__":
    main()
