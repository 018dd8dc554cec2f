"""The study's report in W&B: its figures and tables as one run in the study's group.

A study uses W&B when its cells do: each cell trains with the study's ``fixed`` overrides, whose
``logger.wandb.mode`` (offline by default; the shipped studies set ``disabled``) lands in the
cell's ``RUN/config.yaml``, beside the group ``study-NAME`` that :func:`distnerf.study.plan.expand`
gives every cell. The report then goes into the same group as a run of job type ``report``
(:func:`distnerf.observe.logger.log_study_report`), so W&B shows the study's figures beside its
cells; ``python -m distnerf.study report STUDY_DIR --wandb offline`` logs it for a study whose
cells did not use W&B.
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from ..observe.logger import log_study_report
from ..config_check import section
from ..schema import WandbConfig

TABLES = ("breakdown", "sync", "inference", "input", "quality", "capacity", "ranks", "differs")
"""The report's tables that go to W&B (those that are lists of rows, the headline figures)."""


def cells_wandb(study_dir: Path, cells: list[dict]):
    """The ``logger.wandb`` section of the first finished cell's ``RUN/config.yaml`` (a validated
    :class:`distnerf.schema.WandbConfig`), or None when no cell has finished."""
    for cell in cells:
        config = Path(study_dir) / "cells" / cell["id"] / "config.yaml"
        if cell["status"] == "done" and config.exists():
            return section(WandbConfig, OmegaConf.load(config).logger.wandb)
    return None


def log_report(study_dir: Path, report: dict, mode: str | None = None) -> str | None:
    """Log a written report (:func:`distnerf.study.report.write_report`'s result) to W&B when the cells
    did (``mode`` None) or in ``mode`` (``offline``, ``online``; ``disabled``: never). Returns where
    the run went, or None when nothing was logged."""
    cfg = cells_wandb(study_dir, report["cells"])
    if cfg is None:
        return None
    if mode is not None:
        cfg.mode = mode
    if cfg.mode == "disabled":
        return None
    out = Path(study_dir) / "report"
    tables = {name: rows for name in TABLES if isinstance(rows := report["tables"].get(name), list) and rows}
    done = sum(c["status"] == "done" for c in report["cells"])
    return log_study_report(cfg, study_dir, report["study"], [out / name for name in report["figures"]], tables, done)
