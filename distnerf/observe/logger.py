"""Run loggers: ``metrics.jsonl`` (one JSON object per row), W&B, console progress.

Only the main rank constructs writers; other ranks get a :class:`NullLogger`.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ..schema import WandbConfig, section

log = logging.getLogger("distnerf")


class NullLogger:
    def log(self, row: dict) -> None:
        pass

    def log_images(self, step: int, images: dict) -> None:
        pass

    def close(self) -> None:
        pass


METRICS_LOG = "metrics.jsonl"
"""The run's training log under ``RUN/``: one JSON object per line (:class:`JsonlLogger`)."""


def read_metrics_log(run_dir: Path, partial_tail: bool = False, tail_bytes: int | None = None) -> list[dict]:
    """The rows of ``RUN/metrics.jsonl`` (:data:`METRICS_LOG`), in order; [] when there is none.

    Args:
        run_dir: the run directory.
        partial_tail: the run may still be writing: a last line without its newline is left
            out instead of refused (a reader following a live run).
        tail_bytes: read only the file's last this many bytes (the rows whose lines lie whole in
            them: a poller of a long run), or None: all of it.
    Raises:
        ValueError: a line that is not JSON (naming the file and the line): the run did not end
            cleanly, or the file is not a distnerf log.
    """
    path = Path(run_dir) / METRICS_LOG
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            start = 0 if tail_bytes is None else max(0, size - tail_bytes)
            f.seek(start)
            text = f.read().decode()
    except FileNotFoundError:
        return []
    lines = text.split("\n")
    if start > 0:
        lines = lines[1:]  # the first line may begin before the tail
    if partial_tail and lines and lines[-1]:
        lines = lines[:-1]  # written up to here so far
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            raise ValueError(f"{path}: line {number} is not JSON ({line[:80]!r}): the run did not end cleanly") \
                from None
    return rows


class JsonlLogger:
    """Appends rows to ``path``. On resume from step ``k`` rows with ``step > k`` are
    dropped first, so the file never holds duplicate steps."""

    def __init__(self, path: Path, resume_step: int | None = None):
        self.path = Path(path)
        if resume_step is not None and self.path.exists():
            kept = []
            for line in self.path.read_text().splitlines():
                if not line.strip():
                    continue
                row = json.loads(line)
                if row.get("step", -1) <= resume_step:
                    kept.append(line)
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(k + "\n" for k in kept))
            os.replace(tmp, self.path)
        self.file = open(self.path, "a", buffering=1)

    def log(self, row: dict) -> None:
        self.file.write(json.dumps(row) + "\n")

    def log_images(self, step: int, images: dict) -> None:
        pass  # the images are the PNGs of RUN/val/ and RUN/test/

    def close(self) -> None:
        self.file.close()


class WandbLogger:
    """W&B run (``logger.wandb``: :class:`distnerf.schema.WandbConfig`; ``mode`` offline by default)."""

    def __init__(self, cfg, run_dir: Path, config: dict, resume: bool, strategy_label: str = "ddp"):
        """``strategy_label``: ``ddp``, ``ss_independent`` or ``ss_joint``, the default group (W&B's
        grouping then puts a ddp-vs-ss comparison side by side); ``job_type`` defaults to ``train``."""
        import wandb

        cfg = section(WandbConfig, cfg)
        self.wandb = wandb
        self.run = wandb.init(project=cfg.project, mode=cfg.mode, dir=str(run_dir), config=config,
                              name=cfg.name or run_dir.name, id=cfg.id or _stable_id(run_dir), resume="allow",
                              group=cfg.group or strategy_label, job_type=cfg.job_type or "train")  # restarts continue one run
        # both axes usable in the UI: training step (default x) and training wall time
        self.run.define_metric("step")
        self.run.define_metric("train_seconds")
        self.run.define_metric("*", step_metric="step")

    def log(self, row: dict) -> None:
        step = row.get("step")
        self.run.log({k: v for k, v in row.items() if isinstance(v, (int, float))}, step=step)

    def log_images(self, step: int, images: dict) -> None:
        """``images``: {key: (H, W, 3) uint8 array}, one W&B image panel each at ``step``."""
        self.run.log({k: self.wandb.Image(v, caption=k) for k, v in images.items()}, step=step)

    def close(self) -> None:
        self.run.finish()


def _stable_id(run_dir: Path) -> str:
    import hashlib

    return hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:12]


class MultiLogger:
    def __init__(self, loggers):
        self.loggers = list(loggers)

    def log(self, row: dict) -> None:
        for logger in self.loggers:
            logger.log(row)

    def log_images(self, step: int, images: dict) -> None:
        for logger in self.loggers:
            logger.log_images(step, images)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()
