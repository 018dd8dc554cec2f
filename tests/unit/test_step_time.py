"""The trainer's training time against an independent clock: the wall time of its steps
measured around them from outside the trainer (first step's start to last step's end)."""
from __future__ import annotations

import contextlib

import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from distnerf import distributed as D
from distnerf.config_check import validate
from distnerf.engine.trainer import Trainer
from distnerf.strategy import build_strategy

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_train_seconds_equals_the_wall_time_of_the_steps_within_2_percent(tmp_path, synthetic_cache):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = validate(compose("train", overrides=[
            "experiment=smoke", "sampler=sync", "train.max_steps=40", "monitor.log_every=1000", "checkpoints.every=-1",
            "monitor.progress=false", "eval.enabled=false", "profiler.telemetry=false", f"run_dir={tmp_path}",
            f"dataset.cache_dir={synthetic_cache}"]))
    env = D.init_distributed("cpu", timeout_s=cfg.dist_timeout_s, setup_timeout_s=cfg.dist_setup_timeout_s)
    trainer = Trainer(cfg, build_strategy(cfg.strategy, env), tmp_path)
    edges: list[float] = []

    @contextlib.contextmanager
    def edge(name):  # a phase hook: the first step's first phase starts, each step's end_step ends
        if name == "input_wait" and not edges:
            edges.append(time.perf_counter())
        yield
        if name == "end_step":
            edges[1:] = [time.perf_counter()]

    trainer.phase_hooks.append(edge)
    trainer.fit()
    wall = edges[1] - edges[0]
    assert trainer.step == 40 and wall > 0.2  # enough steps that 2% is a meaningful bound
    assert abs(trainer.train_seconds - wall) <= 0.02 * wall, (trainer.train_seconds, wall)
