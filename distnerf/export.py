"""Weights-only export: ``python -m distnerf.export run_dir=PATH [out=FILE]``.

Writes the newest committed checkpoint's model state, step and the model and
dataset config (no optimizer or RNG state) to ``out`` (default
``RUN/export/model_step_N.pt``), through a temp file and a rename. Render it with
``python -m distnerf.render run_dir=PATH weights=FILE``.
"""
from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import OmegaConf

from .checkpoint import atomic_torch_save
from .render import load_run_config, load_weights


def main(argv: list[str] | None = None) -> Path:
    cfg, run_dir = load_run_config(sys.argv[1:] if argv is None else argv)
    state, step = load_weights(cfg, run_dir)
    out = Path(cfg.get("out") or run_dir / "export" / f"model_step_{step}.pt")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_torch_save({"model": state, "step": step,
                       "config": OmegaConf.to_container(OmegaConf.masked_copy(cfg, ["model", "dataset"]),
                                                        resolve=True)}, out)
    print(out)
    return out


if __name__ == "__main__":
    main()
