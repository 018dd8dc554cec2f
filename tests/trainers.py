"""The real :class:`~distnerf.engine.trainer.Trainer` of one process, built for a test.

    from tests.trainers import build_trainer, run_step
    trainer, env = build_trainer(["model=grid"], tmp_path / "run")
    try:
        batch, out, error, agreed = run_step(trainer)
    finally:
        trainer.close()
        D.shutdown(env)
"""
from __future__ import annotations

from pathlib import Path

CONF = Path(__file__).resolve().parents[1] / "conf"  # the Hydra config directory (conf/train.yaml)
COMMON = ["experiment=smoke", "sampler=sync", "checkpoints.every=-1", "eval.enabled=false", "monitor.progress=false",
          "logger.wandb.mode=disabled", "profiler.telemetry=false", "train.max_steps=100000",
          "monitor.log_every=100000"]
"""The overrides every test trainer starts from: the smoke experiment on the built-in scene, the synchronous
sampler, no checkpoints, evaluation, metrics rows, progress bar, wandb or telemetry, and no step limit in the way."""


def build_trainer(overrides: list[str], run_dir: Path, device: str = "cpu", common: list[str] | None = None):
    """The real Trainer of one process on ``device`` (:func:`distnerf.engine.local_trainer.build_trainer`).

    Args:
        overrides: Hydra overrides of ``conf/train.yaml``, after ``common``.
        run_dir: the run directory (created).
        device: ``cpu`` or ``cuda``.
        common: the overrides before ``overrides`` (default :data:`COMMON`).

    Returns:
        ``(trainer, env)``; the caller closes them: ``trainer.close()`` then ``distnerf.distributed.shutdown(env)``.

    Raises:
        ValueError: the composed config does not validate, or the trainer refuses it.
    """
    from distnerf.engine.local_trainer import build_trainer as build

    return build([*(COMMON if common is None else common), *overrides], run_dir, device)


def run_step(trainer, counter=None) -> tuple:
    """One step of ``Trainer.fit`` (:meth:`~distnerf.engine.trainer.Trainer.step_once`), its phases also sections of
    ``counter`` (a :class:`~distnerf.observe.syncs.SyncCounter` or an ``OpCounter``; None: not counted); what the
    step returned: (batch, outputs, error, agreement).

    Raises:
        AssertionError: the step asks the loop to stop (the time budget or a signal).
    """
    hook = counter.section if counter is not None else None
    if hook is not None:
        trainer.phase_hooks.append(hook)
    try:
        result = trainer.step_once()
    finally:
        if hook is not None:
            trainer.phase_hooks.remove(hook)
    assert result.stop is None, result
    return result.batch, result.out, result.error, result.agreed


def count_syncs(trainer) -> dict:
    """One step (:func:`run_step`) under a :class:`~distnerf.observe.syncs.SyncCounter`, every event labelled with
    the trainer's phase; the counter's summary (``total``, ``by_section``, ``by_location``, ...)."""
    from distnerf.observe.syncs import SyncCounter

    counter = SyncCounter()
    with counter:
        run_step(trainer, counter)
    return counter.summary()
