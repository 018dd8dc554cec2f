"""The non-finite-loss flag read a step late (issue 26 item 8): no host sync in the step, and
still no checkpoint of parameters a non-finite loss produced.

Real trainer runs of one CPU process on the built-in scene; the loss is poisoned at one step
(as ``tests/dist/workers.py`` does for two ranks).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from distnerf import distributed as D
from distnerf.engine.late_flag import LateFlag
from distnerf.engine.trainer import NonFiniteLoss
from distnerf.observe.syncs import SyncCounter


def test_swap_hands_out_the_previous_flag_and_take_the_kept_one():
    flag = LateFlag("cpu")
    with SyncCounter() as syncs:
        assert flag.swap(torch.tensor(True)) == 0.0  # nothing kept yet
        assert flag.swap(torch.tensor(False)) == 1.0  # the first flag, a step late
        assert flag.pending and flag.take() == 0.0
        assert not flag.pending and flag.take() == 0.0
        assert flag.swap(torch.tensor(float("nan")).isfinite().logical_not()) == 0.0
        assert flag.take() == 1.0
    assert syncs.total == 0, syncs.by_location()  # the host buffer's reads wait for no device


@pytest.mark.parametrize("poisoned_step, ckpt_every, kept", [
    (2, 100, []),   # stopped by step 3's agreement, read after its update: nothing saved
    (5, 3, [3]),    # the checkpoint due after step 5 settles the flag first: step_6 is never written
])
def test_a_non_finite_loss_stops_the_run_and_no_checkpoint_holds_its_parameters(tmp_path, monkeypatch,
                                                                                poisoned_step, ckpt_every, kept):
    from distnerf.components import step as step_mod

    real, calls = step_mod.ray_error, {"n": 0}

    def poisoned(*args, **kwargs):
        error = real(*args, **kwargs)
        calls["n"] += 1
        return dataclasses.replace(error, sse=error.sse * float("nan")) if calls["n"] == poisoned_step + 1 else error

    monkeypatch.setattr(step_mod, "ray_error", poisoned)
    from tests import trainers

    trainer, env = trainers.build_trainer([f"checkpoints.every={ckpt_every}", "train.max_steps=12"], tmp_path / "run")
    try:
        with pytest.raises(NonFiniteLoss, match=f"non-finite loss at step {poisoned_step} on 1 rank"):
            trainer.fit()
    finally:
        trainer.close()
        D.shutdown(env)
    saved = sorted(int(p.name.split("_")[1]) for p in (tmp_path / "run" / "checkpoints").glob("step_*")
                   if (p / "manifest.json").exists())
    assert saved == kept
    for step in saved:  # what was kept is finite
        state = torch.load(tmp_path / "run" / "checkpoints" / f"step_{step:08d}" / "model.pt", weights_only=False)
        assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())
