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

import contextlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

COMMON = ["experiment=smoke", "sampler=sync", "train.ckpt_every=-1", "eval.enabled=false", "train.progress=false",
          "logger.wandb.mode=disabled", "profiler.telemetry=false", "train.max_steps=100000"]
"""The overrides every test trainer starts from: the smoke experiment on the built-in scene, the synchronous
sampler, no checkpoints, evaluation, progress bar, wandb or telemetry, and no step limit in the way."""


def build_trainer(overrides: list[str], run_dir: Path, device: str = "cpu", common: list[str] | None = None):
    """The real Trainer of one process on ``device`` (as ``tests/dist/workers.py::trainer_worker``).

    Args:
        overrides: Hydra overrides of ``conf/train.yaml``, after ``common``.
        run_dir: the run directory (created).
        device: ``cpu`` or ``cuda``.
        common: the overrides before ``overrides`` (default :data:`COMMON`).

    Returns:
        ``(trainer, env)``; the caller closes them: ``trainer.close()`` then ``distnerf.dist.shutdown(env)``.

    Raises:
        ValueError: the composed config does not validate.
    """
    from hydra import compose, initialize_config_dir

    from distnerf import dist as D
    from distnerf.config_check import validate
    from distnerf.engine.trainer import Trainer
    from distnerf.strategy import build_strategy

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = validate(compose("train", overrides=[*(COMMON if common is None else common), *overrides,
                                                   f"run_dir={run_dir}"]))
    run_dir.mkdir(parents=True, exist_ok=True)
    env = D.init_distributed(device, timeout_s=cfg.dist_timeout_s, setup_timeout_s=cfg.dist_setup_timeout_s)
    return Trainer(cfg, build_strategy(cfg.strategy, env), run_dir), env


def run_step(trainer, counter=None) -> tuple:
    """One step of ``Trainer.fit`` (without logging, validation, checkpoints) and the trainer's
    ``between_steps`` hooks, counted by ``counter`` (a :class:`~distnerf.observe.syncs.SyncCounter`, its
    ``agree`` and ``end_step`` sections); what ``take_step`` returned (batch, outputs, error, agreement).

    Raises:
        AssertionError: the step's agreement reports a non-finite loss, an over-budget batch or a signal.
    """
    section = counter.section if counter is not None else (lambda name: contextlib.nullcontext())
    trainer.timer.begin_step()
    agree = trainer.agree

    def labelled(*args):  # the trainer's own reads of the step, in their section
        with section("agree"):
            return agree(*args)

    trainer.agree = labelled
    try:
        batch, out, error, agreed = trainer.take_step()
    finally:
        del trainer.agree
    total = agreed.total
    assert not (total.nonfinite or total.over_budget or total.signal), total
    trainer.step += 1
    with section("end_step"):
        trainer.profiler.end_step(trainer.step - 1, agreed.mine.valid_rays, out.get("num_samples", 0),
                                  trainer.strategy.step_comm())
    for hook in trainer.between_steps:  # as fit: after the step, outside its time
        hook()
    return batch, out, error, agreed
