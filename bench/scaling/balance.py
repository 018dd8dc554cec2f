"""Load balance of ``ss`` runs: rays per region, samples and work per rank, imbalance.

    python -m bench.scaling.balance NAME RUN_DIR [RUN_DIR...]
    # e.g. python -m bench.scaling.balance city_balance runs/bench/city_balance_ss_independent runs/bench/city_balance_ss_balanced
    # -> bench/scaling/results/NAME/bench_balance.json

For each finished ``strategy=ss`` run directory (its ``config.yaml``, ``partition.json`` and
``metrics.jsonl``):

* per region: the training rays crossing it, the cameras seeing it and the estimated cost,
  recomputed from the run's own partition and seed exactly as the run's start-up table
  (:func:`distnerf.strategy.partition.region_load` on the same 65,536 sampled rays), and
  its owner (the run's ``model_size`` event);
* per rank, from the run's ``profile_summary`` event (medians over its steady steps): step
  time, the time it waited for the others at the step's agreement (``step_sync``), its
  work (step time minus that wait), field evaluations and samples per ray;
* imbalance: the slowest rank's work / the fastest's (target <= 1.10).

Not timed itself (the runs were, through ``../shared/tools/quiet``); the figures are the runs'.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omegaconf import OmegaConf

from bench.common import default_out, start_meta, write_result
from distnerf.observe.logger import final_model_size, read_metrics_log


def region_table(run: Path) -> dict:
    from distnerf.data import load_scene
    from distnerf.data.images import undecoded
    from distnerf.strategy.partition import Partition, region_load
    from distnerf.strategy.ss import training_ray_sample

    cfg = OmegaConf.load(run / "config.yaml")
    scene = load_scene(cfg.dataset, "train", pixels=undecoded)
    part = Partition.load(run / "partition.json")
    rays, images = training_ray_sample(scene, 65536, int(cfg.seed))
    joint = cfg.strategy.training == "joint"
    stats = region_load(part, rays.origins, rays.directions, rays.near, rays.far, images,
                        None if joint else scene.aabb)
    return {"partition": part.kind, "unbounded": part.unbounded, "training": cfg.strategy.training,
            "num_rays": 65536, "num_cameras": len(scene), **stats}


def rank_table(run: Path) -> dict:
    rows = read_metrics_log(run)
    prof = next(r for r in rows if r.get("event") == "profile_summary")
    size = final_model_size(rows)
    if size is None:
        raise SystemExit(f"{run}/metrics.jsonl: no model_size event: the run did not finish")
    world = len(size["ranks"])
    ranks = []
    for r in range(world):
        get = lambda key: prof[f"profile/rank_{r}/{key}_median"]  # noqa: E731
        ranks.append({"rank": r, "step_s": get("step_s"), "step_sync_s": get("step_sync"),
                      "work_s": get("step_s") - get("step_sync"), "field_evals": get("field_evals"),
                      "samples_per_ray": get("samples_per_ray"), "rays_per_s": get("rays_per_s")})
    work = [x["work_s"] for x in ranks]
    owners = {int(k): v["owner"] for k, v in size.get("parameters_per_region", {}).items()}
    return {"ranks": ranks, "owners": [owners[k] for k in sorted(owners)], "imbalance": max(work) / min(work),
            "steps": size["step"] if "step" in size else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name")
    ap.add_argument("runs", nargs="+", type=Path)
    args = ap.parse_args()
    meta = start_meta()
    report = {"runs": {run.name: {**region_table(run), **rank_table(run)} for run in args.runs}}
    write_result(default_out(__file__, f"{args.name}/bench_balance.json"), report, meta)
    for name, r in report["runs"].items():
        print(f"{name}: rays per region {r['rays']}, owners {r['owners']}, work per rank "
              f"{[round(x['work_s'], 3) for x in r['ranks']]} s, imbalance {r['imbalance']:.3f}")


if __name__ == "__main__":
    main()
