"""Host syncs of one training step, counted on the CPU (:mod:`distnerf.observe.syncs`).

    OMP_NUM_THREADS=1 python -m bench.throughput.syncs --label before   # then, after a change:
    OMP_NUM_THREADS=1 python -m bench.throughput.syncs --label after

For each configuration (``grid``, ``ngp``, ``nerf``, ``ss_independent``: ``strategy=ss
strategy.num_regions=2``, ``ss_joint``: the same with ``strategy.training=joint``; all
``experiment=smoke`` on the built-in scene, one process, ``sampler=sync``) the real
:class:`~distnerf.engine.trainer.Trainer` runs ``--step`` steps exactly as
``Trainer.fit`` does (no logging, evaluation or checkpoints), so the occupancy grids
exist and the smoke grid is past its upsampling (step 10), then one more step
under a :class:`~distnerf.observe.syncs.SyncCounter`: ``Trainer.take_step`` (input, model
update, forward and loss; ``agree``: the trainer's flags and the step's all-reduce launched;
backward, regulariser, optimizer; ``step_sync``: the all-reduce read) and ``profiler.end_step``. For the
marched models the next occupancy-refresh step is counted too (``refresh_step``).

Every event is labelled with the step's phase (``input_wait`` ... ``optimizer``, and
``agree`` / ``end_step`` for the trainer's own reads). Per counted step the JSON holds:
``total``; ``model`` (``model_update``, ``forward``, ``backward``, ``regularizer``,
``optimizer``); ``trainer`` (``agree``, ``step_sync``, ``end_step``); ``input``
(``input_wait``, ``copy``: ``sampler=sync`` builds batches on the host, so these are no
device syncs on CUDA); and ``by_op``, ``by_location``, ``by_section``, ``events``.

With ``--sync-free`` the CPU takes the paths a CUDA run takes where a fixed-size alternative
replaces a size read (:func:`distnerf.host_buffers.sync_free`), so the count is the CUDA one.
``grid_160`` is the grid at lego's final size, where the colour tables' sparse rows branch runs.

Results go to ``bench/throughput/results/syncs/syncs.json`` under ``--label`` (other labels already
in the file are kept), each label with its own meta block (command, date, commit).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path

import torch


from bench.common import ROOT, default_out, finish_meta, start_meta, write_result

CONFIGS = {
    "grid": ["model=grid"],
    "ngp": ["model=ngp"],
    "nerf": ["model=nerf"],
    "ss_independent": ["strategy=ss", "strategy.num_regions=2"],
    "ss_joint": ["strategy=ss", "strategy.training=joint", "strategy.num_regions=2"],
    # lego's final grid size: the colour tables' sparse row branch runs (fewer corner references than rows)
    "grid_160": ["model=grid", "model.resolutions=[160]", "model.upsample_steps=[]"],
}
COMMON = ["experiment=smoke", "sampler=sync", "train.ckpt_every=-1", "eval.enabled=false", "train.progress=false",
          "logger.wandb.mode=disabled", "profiler.telemetry=false", "train.max_steps=100000"]
MODEL = ("model_update", "graph", "forward", "backward", "regularizer", "optimizer")
TRAINER = ("agree", "step_sync", "end_step")
INPUT = ("input_wait", "copy")


def build_trainer(overrides: list[str], run_dir: Path, device: str = "cpu", common: list[str] | None = None):
    """The real Trainer of one process on ``device`` (as ``tests/dist/workers.py::trainer_worker``); ``common``:
    the overrides before ``overrides`` (default :data:`COMMON`)."""
    from hydra import compose, initialize_config_dir

    from distnerf import dist as D
    from distnerf.config_check import validate
    from distnerf.engine.trainer import Trainer
    from distnerf.strategy import build_strategy

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = validate(compose("train", overrides=[*(COMMON if common is None else common), *overrides,
                                                   f"run_dir={run_dir}"]))
    run_dir.mkdir(parents=True, exist_ok=True)
    env = D.init_distributed(device, timeout_s=cfg.dist_timeout_s, setup_timeout_s=cfg.dist_setup_timeout_s)
    return Trainer(cfg, build_strategy(cfg.strategy, env), run_dir), env


def run_step(trainer, counter=None) -> tuple:
    """One step of ``Trainer.fit`` (without logging, validation, checkpoints) and the trainer's
    ``between_steps`` hooks, counted by ``counter``; what ``take_step`` returned (batch, outputs, error,
    agreement)."""
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


def label_phases(trainer, counter) -> None:
    """Make every timed phase of the trainer's step (``trainer.timer.phase``) also a section of ``counter``
    (a SyncCounter or an OpCounter); ``del trainer.timer.phase`` undoes it."""
    timer_phase = trainer.timer.phase

    def phase(name):
        stack = contextlib.ExitStack()
        stack.enter_context(timer_phase(name))
        stack.enter_context(counter.section(name))
        return stack

    trainer.timer.phase = phase


def counted_step(trainer) -> dict:
    from distnerf.observe.syncs import SyncCounter

    counter = SyncCounter()
    label_phases(trainer, counter)
    step = trainer.step
    try:
        with counter:
            run_step(trainer, counter)
    finally:
        del trainer.timer.phase
    res = counter.summary()
    sections = res["by_section"]
    res = {"step": step, "total": res["total"],
           "model": sum(sections.get(k, 0) for k in MODEL),
           "trainer": sum(sections.get(k, 0) for k in TRAINER),
           "input": sum(sections.get(k, 0) for k in INPUT), **res}
    other = res["total"] - res["model"] - res["trainer"] - res["input"]
    assert other == 0, f"events outside the step's phases: {sections}"
    return res


def refresh_every(trainer) -> int | None:
    every = getattr(trainer.cfg.model, "occupancy_every", None)
    return int(every) if every else None


def measure(name: str, overrides: list[str], warmup: int, tmp: Path) -> dict:
    from distnerf import dist as D

    torch.manual_seed(0)
    trainer, env = build_trainer(overrides, tmp / name)
    try:
        while trainer.step < warmup:
            run_step(trainer)
        result = {"overrides": [*COMMON, *overrides], "count_step": counted_step(trainer)}
        every = refresh_every(trainer)
        if every:
            while trainer.step % every:
                run_step(trainer)
            result["refresh_step"] = counted_step(trainer)
    finally:
        trainer.close()
        D.shutdown(env)
    for key in ("count_step", "refresh_step"):
        if key in result:
            r = result[key]
            print(f"{name:15s} {key:12s} step {r['step']:3d}: total {r['total']:3d} (model {r['model']}, "
                  f"trainer {r['trainer']}, input {r['input']})", flush=True)
            for loc, n in r["by_location"].items():
                print(f"    {n:3d}  {loc}")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", default="after", help="key of this measurement in the JSON (before, after, ...)")
    ap.add_argument("--step", type=int, default=17, help="warm-up steps; the next step is counted")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--note", default=None, help="a remark stored with this label (e.g. the state of the tree)")
    ap.add_argument("--out", type=Path, default=None, help="default bench/throughput/results/syncs/syncs.json")
    ap.add_argument("--sync-free", action="store_true",
                    help="count the paths a CUDA run takes where a fixed-size alternative replaces a size read "
                         "(distnerf.host_buffers.sync_free_paths)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = args.out or default_out(__file__, "syncs/syncs.json")
    meta = start_meta()
    report = json.loads(out.read_text()) if out.exists() else {}
    report.pop("meta", None)
    from distnerf.host_buffers import sync_free_paths

    with tempfile.TemporaryDirectory() as tmp, sync_free_paths(args.sync_free):
        configs = {name: measure(name, CONFIGS[name], args.step, Path(tmp)) for name in args.configs}
    label_meta = finish_meta(meta)
    label_meta["sync_free_paths"] = args.sync_free
    if args.note:
        label_meta["note"] = args.note
    report[args.label] = {"meta": label_meta, "configs": configs}
    write_result(out, report, meta)


if __name__ == "__main__":
    main()
