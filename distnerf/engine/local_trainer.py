"""The real :class:`~.trainer.Trainer` of one process from Hydra overrides, for the tests
(``tests/trainers.py``) and the benchmarks that drive the trainer step by step (``bench/throughput/syncs.py``).

    trainer, env = build_trainer(["experiment=smoke", "sampler=sync"], Path("runs/probe"))
    try:
        result = trainer.step_once()
    finally:
        trainer.close()
        distnerf.distributed.shutdown(env)
"""
from __future__ import annotations

from pathlib import Path

CONF = Path(__file__).resolve().parents[2] / "conf"


def build_trainer(overrides: list[str], run_dir: Path, device: str = "cpu"):
    """The Trainer of one process on ``device`` (as ``distnerf.train`` builds it, without its run-directory lock,
    logging set-up and signal handlers).

    Args:
        overrides: Hydra overrides of ``conf/train.yaml`` (``run_dir`` is added).
        run_dir: the run directory (created).
        device: ``cpu`` or ``cuda``.
    Returns:
        ``(trainer, env)``; the caller closes them: ``trainer.close()``, then ``distnerf.distributed.shutdown(env)``.
    Raises:
        ValueError: the composed config does not validate, or the trainer refuses it (a ``ConfigError``).
    """
    from hydra import compose, initialize_config_dir

    from .. import distributed as D
    from ..config_check import validate
    from ..strategy import build_strategy
    from .trainer import Trainer

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = validate(compose("train", overrides=[*overrides, f"run_dir={run_dir}"]))
    run_dir.mkdir(parents=True, exist_ok=True)
    env = D.init_distributed(device, timeout_s=cfg.dist_timeout_s, setup_timeout_s=cfg.dist_setup_timeout_s)
    try:
        return Trainer(cfg, build_strategy(cfg.strategy, env), run_dir), env
    except BaseException:
        D.shutdown(env)  # a refused config: no process group left behind for the next trainer of this process
        raise
