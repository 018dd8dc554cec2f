"""How a live run's page ends (issue 60, item 7): before the live viewer's server closes, its
status says the run finished, or why it stopped, and no longer that it is live. Here a real
training run in this process, its server's status read as it closes; a rank lost in a real 2-rank
run: ``tests/launch/test_torchrun.py`` (the rank-death case, viewer enabled); the page of a run
stopped by a signal, in chromium: ``tests/e2e/test_viewer.py`` (the live ``ss`` case)."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

pytest.importorskip("viser")

from distnerf import distributed as D  # noqa: E402
from distnerf.config_check import validate  # noqa: E402
from distnerf.engine.trainer import Trainer  # noqa: E402
from distnerf.strategy import build_strategy  # noqa: E402
from tests.conftest import free_port  # noqa: E402

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_a_finished_live_run_says_finished_before_its_viewer_closes(tmp_path, synthetic_cache):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = validate(compose("train", overrides=[
            "experiment=smoke", "sampler=sync", "train.max_steps=6", "monitor.log_every=1000", "checkpoints.every=-1",
            "monitor.progress=false", "eval.enabled=false", "profiler.telemetry=false", f"run_dir={tmp_path}",
            f"dataset.cache_dir={synthetic_cache}", "viewer.enabled=true", f"viewer.port={free_port()}"]))
    env = D.init_distributed("cpu", timeout_s=cfg.dist_timeout_s, setup_timeout_s=cfg.dist_setup_timeout_s)
    trainer = Trainer(cfg, build_strategy(cfg.strategy, env), tmp_path)
    server = trainer.viewer.server
    statuses, closing = [], []  # every status the page was sent; the one it shows as the server closes
    set_status, stop = server.set_status, server.stop
    server.set_status = lambda text: (statuses.append(text), set_status(text))
    server.stop = lambda *args: (closing.append(server.status.content), stop(*args))
    trainer.fit()
    assert any(s.startswith("**live** step") for s in statuses), statuses  # the premise: it said live
    assert closing == ["**finished** at step 6"], (closing, statuses[-3:])
