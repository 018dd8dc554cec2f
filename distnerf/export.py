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

from . import cli as C
from .checkpoint import SCENE_TRANSFORM_FILE, CheckpointError
from .fileio import atomic_torch_save
from .engine.runs import find_checkpoint, load_run_config, load_weights
from .config_check import ConfigError
from .schema import RenderConfig
from .strategy.ss_loading import region_states

ENTRY = C.Entry(
    "export", "Write a run's model weights (newest committed checkpoint, no optimizer state) to one file, "
    "for distnerf-render weights=FILE.", "run_dir=PATH [out=FILE] [checkpoint=DIR]",
    [C.Key("run_dir", "(required)", "the run's directory (RUN/config.yaml, RUN/checkpoints/)"),
     *C.schema_keys(RenderConfig, only=["out", "checkpoint"])],
    examples=["run_dir=runs/main", "run_dir=runs/main out=lego.pt checkpoint=runs/main/checkpoints/step_00000500"],
    notes="The file written is printed on stdout.",
    required=[("run_dir", "the run to export")], existing=["run_dir", "checkpoint"])


def main(argv: list[str] | None = None) -> Path:
    argv = ENTRY.parse(sys.argv[1:] if argv is None else argv)
    with ENTRY.usage_errors():  # no config.yaml, an unknown key, a wrong value: one line, exit 2
        cfg, run_dir = load_run_config(argv, prog=ENTRY.prog)
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


def cli(argv: list[str] | None = None) -> int:
    """``distnerf-export`` / ``python -m distnerf.export``: :func:`main`; a config error is one line (exit 2), a
    missing or damaged checkpoint one line (exit 1)."""
    try:
        with ENTRY.usage_errors(ConfigError):
            main(argv)
    except (FileNotFoundError, CheckpointError) as err:  # no committed checkpoint yet, a damaged one: one line
        ENTRY.error(err, status=1)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
