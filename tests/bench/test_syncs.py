"""bench/throughput/syncs.py's count of a training step's host syncs (its runner, on the trainer's public step and
phase hooks), and the ceiling it holds the smoke grid's step to."""
from __future__ import annotations

from bench.throughput import syncs as bench
from distnerf import distributed as D


def test_grid_training_step_host_syncs_do_not_rise(tmp_path):
    """The smoke grid model (past its upsampling at step 10) on one CPU process, as
    ``python bench/throughput/syncs.py --configs grid`` counts it."""
    # one marching pass per training ray (model.train_round_steps=0, the default): rounds (opt-in) read the
    # march's sizes once per round (3 more per round; they save the density behind each ray's cut)
    trainer, env = bench.build_trainer(bench.CONFIGS["grid"] + ["model.train_round_steps=0"], tmp_path / "run")
    try:
        while trainer.step < 17:
            bench.run_step(trainer)
        step = bench.counted_step(trainer)
        while trainer.step % trainer.cfg.model.occupancy_every:
            bench.run_step(trainer)
        refresh = bench.counted_step(trainer)
    finally:
        trainer.close()
        D.shutdown(env)
    # reached 2026-12-01 (before: 14 model syncs per step, 17 on a refresh step): the model reads 4 sizes
    # per step (the march's candidate intervals and samples, the samples in front of the termination cut,
    # the coloured samples), + 1 on an occupancy refresh step (the coarse grid's sizes, once per change).
    # The trainer 1 (4 before StepStats.host_values): the tensor fields of the step's flags read back in
    # one transfer; the Python-number flags stay on the host and are all-reduced on the CPU
    # 2026-12-03: 3 and 4, a training render no longer cuts at the termination point by default
    # (model.train_termination=false): the size of the samples in front of the cut is not read
    assert step["model"] <= 3, step["by_location"]
    assert refresh["model"] <= 4, refresh["by_location"]
    # 2026-12-04: the trainer 0 (issue 26 item 8): every ray is valid (no ray filter), so the valid count is
    # the batch size, and the non-finite-loss flag is read a step late from a host buffer (engine/late_flag.py);
    # a lent H200's sync-debug mode found the same places as this counter (bench/gpu/README.md)
    assert step["trainer"] == 0 and refresh["trainer"] == 0, (step["by_location"], refresh["by_location"])
    assert step["total"] <= 3, step["by_location"]
