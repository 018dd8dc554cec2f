"""Run loggers: ``metrics.jsonl`` (one JSON object per row), W&B, console progress.

Only the main rank constructs writers; other ranks get a :class:`NullLogger`.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ..config_check import section
from ..schema import WandbConfig
from .wandb_records import run_files

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


PEAK_MEMORY_KEYS = ("peak_rss_mb", "peak_device_memory_mb")


def final_model_size(rows: list[dict]) -> dict | None:
    """The run's ``model_size`` figures from its log rows (:func:`read_metrics_log`): the finished
    model's, across every session of a stopped and resumed run.

    Each session logs one ``model_size`` event when it stops (:func:`distnerf.observe.summary.model_size_event`):
    a run stopped mid-way logged one before its grid's last stage (fewer parameters) and with that
    process's peak memory only. The parameters (and ``ranks``, ``parameters_per_region``) are the
    *last* event's; each peak memory figure (``peak_rss_mb``, ``peak_device_memory_mb``, MiB, and the
    same per rank where the sessions had the same world size) is the *maximum* over the events, the
    run's true peak.

    Returns:
        the event's dict with the peaks so combined, or None when the rows hold no ``model_size``
        event (a run that never reached its end).
    """
    events = [r for r in rows if r.get("event") == "model_size"]
    if not events:
        return None
    out = {**events[-1], "ranks": [dict(r) for r in events[-1].get("ranks", [])]}
    same_world = [e.get("ranks", []) for e in events if len(e.get("ranks", [])) == len(out["ranks"])]
    for key in PEAK_MEMORY_KEYS:
        seen = [e[key] for e in events if e.get(key) is not None]
        if seen:
            out[key] = max(seen)
        for i, rank in enumerate(out["ranks"]):
            seen = [ranks[i][key] for ranks in same_world if ranks[i].get(key) is not None]
            if seen:
                rank[key] = max(seen)
    return out


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


def strategy_label(strategy_cfg) -> str:
    """``ddp``, ``ss_independent`` or ``ss_joint`` (a ``strategy`` config section): a run's default W&B
    group, and the config key ``strategy_label`` its W&B run carries."""
    return "ddp" if strategy_cfg.name == "ddp" else f"ss_{strategy_cfg.training}"


VIDEO_FORMATS = ("gif", "mp4", "webm", "ogg")
"""The video files W&B plays (``wandb.Video.EXTS``); ``wandb.Video`` takes such a file as it is
(moviepy is needed only to encode frames, never for a file)."""


class WandbLogger:
    """W&B run (``logger.wandb``: :class:`distnerf.schema.WandbConfig`; ``mode`` offline by default)."""

    def __init__(self, cfg, run_dir: Path, config: dict | None, resume: bool, strategy_label: str = "ddp",
                 run_id: str | None = None):
        """``strategy_label``: ``ddp``, ``ss_independent`` or ``ss_joint``, the default group (W&B's
        grouping then puts a ddp-vs-ss comparison side by side); ``job_type`` defaults to ``train``.
        ``config`` None: the run's config is left as it is (a run opened again). ``run_id``: the W&B run
        id where ``logger.wandb.id`` gives none (default: derived from the run directory's path)."""
        import wandb

        cfg = section(WandbConfig, cfg)
        self.wandb = wandb
        self.run = wandb.init(project=cfg.project, mode=cfg.mode, dir=str(run_dir), config=config,
                              name=cfg.name or run_dir.name, id=cfg.id or run_id or _stable_id(run_dir),
                              resume="allow",
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

    @classmethod
    def reopen(cls, run_cfg, run_dir: Path) -> "WandbLogger":
        """The W&B run that the training of ``run_dir`` logged to, opened again after it ended: the same
        id (``logger.wandb.id``, else that of the run's first folder in ``RUN/wandb``, so a run directory
        moved since still finds its run, else the one derived from the run directory), name, group and
        job type, in ``RUN/wandb``. Online W&B resumes the run; offline, wandb writes a new
        ``offline-run-*`` folder with the same run id, and ``wandb sync RUN/wandb/offline-run-*``
        uploads the folders into the one run in the order they started.

        Args:
            run_cfg: the run's whole config (``RUN/config.yaml``): its ``logger.wandb`` and ``strategy``.
        """
        logged = run_files(run_dir)
        run_id = logged[0].stem.removeprefix("run-") if logged else None  # run-<id>.wandb
        return cls(run_cfg.logger.wandb, Path(run_dir), None, True, strategy_label(run_cfg.strategy), run_id)

    def log_videos(self, step: int, videos: dict) -> list[str]:
        """``videos``: {key: video file}, one W&B video panel each, at ``step`` (the model's training step,
        also logged as ``step``, the panels' x axis). Where the run's W&B step is already past it (an
        online resume after the training's last row), at the run's current step instead: W&B drops a
        row logged at an earlier step. A file W&B does not play (not one of :data:`VIDEO_FORMATS`) is
        left out with a warning. Returns the keys logged."""
        row = {}
        for key, path in videos.items():
            path = Path(path)
            if path.suffix.lower().lstrip(".") not in VIDEO_FORMATS:
                log.warning("W&B: %s is not logged as %s: W&B plays only %s files", path, key, "/".join(VIDEO_FORMATS))
                continue
            row[key] = self.wandb.Video(str(path), caption=path.name)
        if row:
            self.run.log({**row, "step": step}, step=max(step, self.run.step))
        return list(row)

    def close(self) -> None:
        self.run.finish()


def log_render_videos(run_cfg, run_dir: Path, step: int, videos: dict) -> list[str]:
    """``distnerf.render``'s videos ({key: file}, e.g. ``{"render/video": fly-through}``) into the W&B run of
    the training of ``run_dir`` (:meth:`WandbLogger.reopen`), when that run logs to W&B
    (``logger.wandb.mode`` not ``disabled``) with media (``logger.wandb.log_images``). Returns the keys
    logged ([] when W&B is off)."""
    wandb_cfg = section(WandbConfig, run_cfg.logger.wandb)
    if wandb_cfg.mode == "disabled" or not wandb_cfg.log_images or not videos:
        return []
    logger = WandbLogger.reopen(run_cfg, run_dir)
    try:
        return logger.log_videos(step, videos)
    finally:
        logger.close()


def log_study_report(wandb_cfg, study_dir: Path, config: dict, figures: list, tables: dict, step: int) -> str:
    """A study's report as one W&B run of job type ``report`` in the study's group (``logger.wandb.group`` of
    its cells, ``study-NAME``), in ``STUDY_DIR/wandb``: each figure an image ``report/<file stem>``, each
    table a ``wandb.Table`` ``table/<name>``. Its id is derived from ``STUDY_DIR/report``, so a report
    written again (more cells finished) continues the same run, at ``step`` (the finished cells) or after
    the run's last step.

    Args:
        wandb_cfg: the cells' ``logger.wandb`` (mode, project, group), the mode possibly overridden.
        config: the run's config (the study config).
        figures: PNG files. tables: {name: [row dict]}; a value that is not a number, string or bool is
            written as its JSON.
    Returns:
        the run's local directory (offline) or its URL.
    """
    import wandb

    cfg = section(WandbConfig, wandb_cfg)
    run = wandb.init(project=cfg.project, mode=cfg.mode, dir=str(study_dir), config=config, name="report",
                     id=_stable_id(Path(study_dir) / "report"), resume="allow", group=cfg.group, job_type="report")
    try:
        row = {f"report/{Path(p).stem}": wandb.Image(str(p), caption=Path(p).name) for p in figures}
        for name, rows in tables.items():
            columns = list(dict.fromkeys(k for r in rows for k in r))
            cell = lambda v: v if v is None or isinstance(v, (int, float, str, bool)) else json.dumps(v, default=str)  # noqa: E731
            row[f"table/{name}"] = wandb.Table(columns=columns, data=[[cell(r.get(c)) for c in columns] for r in rows],
                                               allow_mixed_types=True)
        run.log(row, step=max(step, run.step))
        return run.url or str(Path(run.dir).parent)
    finally:
        run.finish()


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
