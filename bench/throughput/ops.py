"""Dispatched operators per training step (:mod:`distnerf.observe.ops`), counted on the CPU.

    OMP_NUM_THREADS=1 python -m bench.throughput.ops --label after --data ../shared/data/nerf_synthetic_half/lego
    OMP_NUM_THREADS=1 DISTNERF_LEGO=DIR python -m bench.throughput.ops --label before --tree /tmp/distnerf_e1483d9

On a GPU a step's host cost is set by how many operators it dispatches, not by its batch (issue 49: 426 per
grid step at ``e1483d9``, the same at 64 rays as at 4096). For each configuration the real
:class:`~distnerf.engine.trainer.Trainer` (one CPU process, ``sampler=sync``) runs 17 steps as ``Trainer.fit``
does (the smoke grid is then past its upsampling at step 10), then one step under an
:class:`~distnerf.observe.ops.OpCounter`: ATen operators, views excluded, per phase (``input_wait`` ...
``optimizer``) and per operator. With ``--cuda-paths`` (the default) the CPU takes the paths a CUDA run takes
(:func:`distnerf.host_buffers.sync_free_paths`), so the count is the CUDA one.

The ``lego_*`` configurations read lego from ``--data DIR`` (default ``$DISTNERF_LEGO``); without either only the
built-in scene's configurations can be counted.

``--tree DIR`` counts another checkout's ``distnerf`` (e.g. ``git worktree add /tmp/old e1483d9``): the
worker runs in a fresh ``python -P`` process with that tree first on its path and the counter loaded from this
checkout's file (older trees have none). Results go to ``bench/throughput/results/ops/ops.json`` under
``--label`` (other labels kept), each with its meta block (command, commit, load).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIGS = {  # "LEGO" stands for the scene's folder (--data)
    # the README lego line's options on its data (ray count aside: the count does not depend on it)
    "lego_grid": ["dataset=blender", "dataset.root=LEGO"],
    "lego_grid_64_rays": ["dataset=blender", "dataset.root=LEGO", "train.global_rays=64"],
    "smoke_grid": ["model=grid"],
    # the static, sync-free step (step.samples_per_step; CUDA's default), the same options
    "lego_grid_static": ["dataset=blender", "dataset.root=LEGO", "step.samples_per_step=65536"],
    "smoke_ngp": ["model=ngp"],
}


def config_overrides(name: str, lego: str | None) -> list[str]:
    """Configuration ``name``'s overrides with lego's folder ``lego`` in place of ``LEGO``. Raises ValueError
    for a lego configuration without a folder, FileNotFoundError for a folder with no ``transforms_train.json``."""
    overrides = CONFIGS[name]
    if not any("LEGO" in o for o in overrides):
        return list(overrides)
    if not lego:
        raise ValueError(f"configuration {name} reads lego: give --data DIR or set DISTNERF_LEGO")
    if not (Path(lego) / "transforms_train.json").is_file():
        raise FileNotFoundError(f"configuration {name}: no lego scene at {lego} (no transforms_train.json)")
    return [o.replace("LEGO", str(lego)) for o in overrides]
COMMON = ["experiment=smoke", "sampler=sync", "checkpoints.every=-1", "eval.enabled=false", "monitor.progress=false",
          "logger.wandb.mode=disabled", "profiler.telemetry=false", "train.max_steps=100000", "monitor.log_every=100000"]
WARMUP = 17


def _counter_module():
    """This checkout's ``distnerf/observe/ops.py``, loaded from its file (an older tree has none)."""
    path = Path(__file__).resolve().parents[2] / "distnerf" / "observe" / "ops.py"
    spec = importlib.util.spec_from_file_location("_distnerf_op_counter", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def count(name: str, overrides: list[str], cuda_paths: bool, root: Path, device: str = "cpu") -> dict:
    """One configuration's counted step, in this process (whatever ``distnerf`` it imports)."""
    import torch
    from hydra import compose, initialize_config_dir

    from distnerf import distributed as D
    from distnerf.engine.trainer import Trainer
    from distnerf.host_buffers import sync_free_paths
    from distnerf.strategy import build_strategy

    ops_module = _counter_module()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp, sync_free_paths(cuda_paths):
        with initialize_config_dir(config_dir=str(root / "conf"), version_base="1.3"):
            cfg = compose("train", overrides=[*COMMON, *overrides, f"device={device}", f"run_dir={tmp}/run"])
        try:  # validated once at the entry point since the config-once change; older trainers validate
            from distnerf.config_check import validate
            cfg = validate(cfg)
        except (ImportError, TypeError):
            pass
        env = D.init_distributed(device, timeout_s=cfg.dist_timeout_s, setup_timeout_s=cfg.dist_setup_timeout_s)
        trainer = Trainer(cfg, build_strategy(cfg.strategy if hasattr(cfg.strategy, "name") else dict(cfg.strategy),
                                              env), Path(tmp) / "run")
        counter = ops_module.OpCounter()

        def step() -> None:
            if hasattr(trainer, "step_once"):  # the public step (issue 63): fit's body
                trainer.step_once()
                return
            trainer.timer.begin_step()
            if hasattr(trainer, "take_step"):  # since the step agreement moved after the update (issue 50)
                batch, out, error, agreed = trainer.take_step()
            else:
                batch, out, error = trainer.train_step(trainer.step)
                sse = getattr(error, "sse", error)  # a RayError since the config-once change, a tensor before
                agreed = trainer.agree(batch, sse)
                trainer.step_fn.update(sse / agreed.loss_normalizer)
            trainer.step += 1
            trainer.profiler.end_step(trainer.step - 1, agreed.mine.valid_rays, out.get("num_samples", 0),
                                      trainer.strategy.step_comm())

        try:
            while trainer.step < WARMUP:
                step()
            with labelled_phases(trainer, counter), counter:  # every phase labels the operators inside it
                step()
        finally:
            trainer.close()
            D.shutdown(env)
    summary = counter.summary()
    print(f"{name:18s} {summary['total']:4d} operators  {summary['by_section']}", flush=True)
    return {"overrides": [*COMMON, *overrides], "step": WARMUP, **summary}


@contextlib.contextmanager
def labelled_phases(trainer, counter):
    """Inside: every phase of the trainer's step is a section of ``counter`` (an OpCounter): through the public
    phase hooks (``Trainer.phase_hooks``), or, on a trainer from before them, its timer's ``phase`` wrapped."""
    if hasattr(trainer, "phase_hooks"):
        trainer.phase_hooks.append(counter.section)
        try:
            yield
        finally:
            trainer.phase_hooks.remove(counter.section)
        return
    timer_phase = trainer.timer.phase

    def phase(name):
        stack = contextlib.ExitStack()
        stack.enter_context(timer_phase(name))
        stack.enter_context(counter.section(name))
        return stack

    trainer.timer.phase = phase
    try:
        yield
    finally:
        del trainer.timer.phase


def worker(args) -> None:
    root = Path(os.environ.get("BENCH_OPS_TREE", Path(__file__).resolve().parents[2]))
    print(json.dumps({name: count(name, config_overrides(name, args.data), args.cuda_paths, root, args.device)
                      for name in args.configs}))


def main() -> None:
    from bench.common import default_out, finish_meta, start_meta, write_result

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", default="after", help="key of this measurement in the JSON (before, after, ...)")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--tree", type=Path, default=None, help="count another checkout's distnerf (a git worktree)")
    ap.add_argument("--cpu-paths", dest="cuda_paths", action="store_false",
                    help="count the CPU's own paths instead of the CUDA ones")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="where the step runs (cuda: the GPU check's section; the counts are the same by design)")
    ap.add_argument("--data", default=os.environ.get("DISTNERF_LEGO"),
                    help="lego's folder for the lego_* configurations (default $DISTNERF_LEGO)")
    ap.add_argument("--note", default=None)
    ap.add_argument("--out", type=Path, default=None, help="default bench/throughput/results/ops/ops.json")
    args = ap.parse_args()
    lego = str(Path(args.data).resolve()) if args.data else None  # the worker runs in --tree's folder
    try:
        for name in args.configs:
            config_overrides(name, lego)
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"bench.throughput.ops: {err}")
    out = args.out or default_out(__file__, "ops/ops.json")
    meta = start_meta()
    here = Path(__file__).resolve().parents[2]
    tree = (args.tree or here).resolve()
    env = {**os.environ, "BENCH_OPS_TREE": str(tree), "PYTHONPATH": f"{tree}{os.pathsep}{here}",
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-P", "-m", "bench.throughput.ops", "worker", "--device", args.device,
           "--configs", *args.configs] + (["--data", lego] if lego else [])
    if not args.cuda_paths:
        cmd.append("--cpu-paths")
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"bench.throughput.ops: the worker failed in {tree}:\n{proc.stderr[-3000:]}")
    lines = proc.stdout.strip().splitlines()
    print("\n".join(lines[:-1]))
    configs = json.loads(lines[-1])
    report = json.loads(out.read_text()) if out.exists() else {}
    label_meta = finish_meta(meta)
    from bench.common import git_state
    label_meta.update({"tree": str(tree), "tree_commit": git_state(tree)["git_commit"], "cuda_paths": args.cuda_paths,
                       "device": args.device})
    if args.note:
        label_meta["note"] = args.note
    report.pop("meta", None)
    report[args.label] = {"meta": label_meta, "configs": configs}
    write_result(out, report, meta)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        ap = argparse.ArgumentParser()
        ap.add_argument("worker")
        ap.add_argument("--configs", nargs="+")
        ap.add_argument("--cpu-paths", dest="cuda_paths", action="store_false")
        ap.add_argument("--device", default="cpu")
        ap.add_argument("--data", default=None)
        worker(ap.parse_args())
    else:
        main()
