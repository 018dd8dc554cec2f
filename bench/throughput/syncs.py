"""Host syncs of one training step, counted on the CPU (:mod:`distnerf.observe.syncs`).

    OMP_NUM_THREADS=1 python -m bench.throughput.syncs --label before   # then, after a change:
    OMP_NUM_THREADS=1 python -m bench.throughput.syncs --label after

For each configuration (``grid``, ``ngp``, ``nerf``, ``ss_independent``: ``strategy=ss
strategy.num_regions=2``, ``ss_joint``: the same with ``strategy.training=joint``; all
``experiment=smoke`` on the built-in scene, one process, ``sampler=sync``) the real
:class:`~distnerf.engine.trainer.Trainer` runs ``--step`` steps of ``Trainer.step_once`` (``fit``'s
body; evaluation and checkpoints off), so the occupancy grids exist and the smoke grid is past its
upsampling (step 10), then one more step under a :class:`~distnerf.observe.syncs.SyncCounter`:
``Trainer.step_once`` (input, model update, forward and loss; ``agree``: the trainer's flags and the
step's all-reduce launched; backward, regulariser, optimizer; ``step_sync``: the all-reduce read;
``end_step``: the profiler's; ``after_step``: the loop's work between steps, a metrics row every
``monitor.log_every`` steps). For the marched models the next occupancy-refresh step is counted too
(``refresh_step``).

Every event is labelled with the step's phase: the counter's ``section`` is a trainer phase hook
(``Trainer.phase_hooks``, :data:`distnerf.engine.phases.PHASES`). Per counted step the JSON holds:
``total``; ``model`` (``model_update``, ``forward``, ``backward``, ``regularizer``,
``optimizer``); ``trainer`` (``agree``, ``step_sync``, ``end_step``, ``after_step``); ``input``
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
COMMON = ["experiment=smoke", "sampler=sync", "checkpoints.every=-1", "eval.enabled=false", "monitor.progress=false",
          "logger.wandb.mode=disabled", "profiler.telemetry=false", "train.max_steps=100000",
          "monitor.log_every=100000"]
MODEL = ("model_update", "graph", "forward", "backward", "regularizer", "optimizer")
TRAINER = ("agree", "step_sync", "end_step", "after_step")
INPUT = ("input_wait", "copy")


def build_trainer(overrides: list[str], run_dir: Path, device: str = "cpu", common: list[str] | None = None):
    """The real Trainer of one process on ``device`` (:func:`distnerf.engine.local_trainer.build_trainer`);
    ``common``: the overrides before ``overrides`` (default :data:`COMMON`). Returns ``(trainer, env)``."""
    from distnerf.engine.local_trainer import build_trainer as build

    return build([*(COMMON if common is None else common), *overrides], run_dir, device)


def run_step(trainer):
    """One step of ``Trainer.fit`` (:meth:`~distnerf.engine.trainer.Trainer.step_once`); its
    :class:`~distnerf.engine.phases.StepResult`. Raises AssertionError where the step asks the loop to stop."""
    result = trainer.step_once()
    assert result.stop is None, result
    return result


def counted_step(trainer) -> dict:
    """One step under a :class:`~distnerf.observe.syncs.SyncCounter`, every event labelled with the trainer's phase
    (the counter's ``section`` as a phase hook: :meth:`~distnerf.engine.trainer.Trainer.phase`)."""
    from distnerf.observe.syncs import SyncCounter

    counter = SyncCounter()
    step = trainer.step
    trainer.phase_hooks.append(counter.section)
    try:
        with counter:
            run_step(trainer)
    finally:
        trainer.phase_hooks.remove(counter.section)
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
    from distnerf import distributed as D

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
