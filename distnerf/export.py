"""Weights-only export: ``python -m distnerf.export run_dir=PATH [out=FILE] [checkpoint=DIR]``.

Writes the newest committed checkpoint's model weights, step and the model, dataset
and strategy config (no optimizer, RNG or sampler state) to ``out`` (default
``RUN/export/model_step_N.pt``), through a temp file and a rename:

- ``ddp``: ``{"model": state_dict, "step", "config"}``;
- ``ss`` (independent or joint): a fused export, ``{"regions": {k: state_dict}, "partition",
  "step", "config"}``: every region's sub-model in one file.

Render it with ``python -m distnerf.render run_dir=PATH weights=FILE``.
"""
from __future__ import annotations

import sys
import json
from pathlib import Path

from omegaconf import OmegaConf

from .checkpoint import SCENE_TRANSFORM_FILE
from .fileio import atomic_torch_save
from .engine.runs import find_checkpoint, load_run_config, load_weights
from .config_check import ConfigError
from .strategy.ss_loading import region_states


def main(argv: list[str] | None = None) -> Path:
    cfg, run_dir = load_run_config(sys.argv[1:] if argv is None else argv)
    config = OmegaConf.to_container(OmegaConf.masked_copy(cfg, ["model", "dataset", "strategy"]), resolve=True)
    if cfg.strategy.name == "ss":
        found, manifest = find_checkpoint(cfg, run_dir)
        partition, step = manifest["partition"], int(manifest["step"])
        state = region_states(found)
        blob = {"regions": {k: state(k) for k in range(len(partition["boxes"]))}, "partition": partition,
                "step": step, "config": config}
    else:
        model_state, step = load_weights(cfg, run_dir)
        blob = {"model": model_state, "step": step, "config": config}
    transform = run_dir / SCENE_TRANSFORM_FILE  # weights are in the scene's normalised frame: say which
    if transform.is_file():
        blob["scene_transform"] = json.loads(transform.read_text())
    out = Path(cfg.out or run_dir / "export" / f"model_step_{step}.pt")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_torch_save(blob, out)
    print(out)
    return out


if __name__ == "__main__":
    try:
        main()
    except ConfigError as err:
        raise SystemExit(f"distnerf.export: {err}") from None
