"""Launch and recovery figures (BENCHMARKS.md, "Launch and recovery").

    python -m bench.reliability.launch first-step --repeats 3   # sbatch -> first step on a local Slurm vs torchrun
    python -m bench.reliability.launch kill --repeats 3         # SIGKILL of one rank: time to the first step after resume
    python -m bench.reliability.launch ckpt --strategy ddp      # checkpoint write time and size (2 ranks, main model)

All runs are 2-rank CPU (gloo) runs of ``experiment=smoke`` (first-step, kill) or of the
default grid model at its final resolution 160^3 (ckpt). ``first-step`` starts its own
single-node Slurm with ``tools/slurm_local.sh`` (root, Debian's slurm packages) and
interleaves Slurm and plain-torchrun launches. Times are wall-clock seconds; the machine
load (``uptime``) is printed with the figures. Prints one JSON object per measurement
and a summary, and writes them to ``--out`` (default ``bench/reliability/results/launch_first-step.json``,
``launch_kill_STRATEGY.json``, ``launch_ckpt_STRATEGY.json``) with a ``meta`` block (command,
date, git commit, load before/after).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT as REPO, default_out, start_meta, write_result

from tests.conftest import free_port
from tests.launch.conftest import (SMOKE, SlurmCluster, finish, launch_local, last_step, rows,
                                   trainer_ranks, wait_for)


def first_row_time(run: Path, timeout: float) -> float:
    """Wall time at which the first step's row appeared in ``run/metrics.jsonl`` (polled every 20 ms)."""
    wait_for(lambda: last_step(run) >= 1, timeout, f"the first step of {run}", interval=0.02)
    return time.time()


def bench_first_step(repeats: int, root: Path) -> list[dict]:
    conf = root / "slurm"
    env = {**os.environ, "SLURM_LOCAL_PORT": str(free_port())}
    subprocess.run(["bash", str(REPO / "tools" / "slurm_local.sh"), "start", str(conf)], env=env, check=True)
    cluster, out = SlurmCluster(conf), []
    args = [*SMOKE, "train.max_steps=20", "eval.enabled=false"]
    try:
        for i in range(repeats):
            run = root / f"slurm_{i}"
            t0 = time.time()
            job = cluster.sbatch("slurm_train.sbatch", args, ["--gpus-per-node=0", "--cpus-per-task=2", f"--output={root}/slurm_{i}.out"],
                                 {"NPROC": "2", "RUN_DIR": str(run)})
            wait_for(lambda: cluster.job(job).get("JobState") != "PENDING", 60, "the job to start", interval=0.02)
            started = time.time()
            first = first_row_time(run, 300)
            cluster.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED"), 300)
            out.append({"launcher": "sbatch", "to_running_s": started - t0, "to_first_step_s": first - t0})
            print(json.dumps(out[-1]), flush=True)
            run = root / f"local_{i}"
            t0 = time.time()
            proc = launch_local(2, run, ["eval.enabled=false", "train.max_steps=20"], env={"MAX_RESTARTS": "0"})
            first = first_row_time(run, 300)
            finish(proc, 300, "local run")
            out.append({"launcher": "torchrun_local.sh", "to_first_step_s": first - t0})
            print(json.dumps(out[-1]), flush=True)
    finally:
        subprocess.run(["bash", str(REPO / "tools" / "slurm_local.sh"), "stop", str(conf)], env=env)
    return out


def bench_kill(repeats: int, root: Path, strategy: str) -> list[dict]:
    out = []
    for i in range(repeats):
        run = root / f"kill_{strategy}_{i}"
        proc = launch_local(2, run, [f"strategy={strategy}", "train.max_steps=60", "eval.enabled=false"],
                            env={"MAX_RESTARTS": "1"})
        wait_for(lambda: last_step(run) >= 22, 300, "step 22")
        ranks = trainer_ranks(proc.pid, run)
        kill_step = last_step(run)
        t_kill = time.time()
        os.kill(ranks[1], signal.SIGKILL)
        resumed = wait_for(lambda: [r for r in rows(run) if r.get("event") == "resumed"], 300, "the resume")[0]
        t_resumed = time.time()
        wait_for(lambda: last_step(run) > resumed["step"], 300, "the first step after the resume", interval=0.02)
        t_first = time.time()
        wait_for(lambda: last_step(run) >= kill_step, 300, "the step of the kill again", interval=0.02)
        t_back = time.time()
        assert finish(proc, 300, "restarted run") == 0
        out.append({"strategy": strategy, "kill_step": kill_step, "resumed_step": resumed["step"],
                    "kill_to_resumed_s": t_resumed - t_kill, "kill_to_first_step_s": t_first - t_kill,
                    "kill_to_kill_step_again_s": t_back - t_kill})
        print(json.dumps(out[-1]), flush=True)
    return out


def bench_ckpt(strategy: str, repeats: int, root: Path) -> list[dict]:
    """Run this file's ``_ckpt`` worker under torchrun (2 ranks)."""
    result = root / f"ckpt_{strategy}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__, "_ckpt",
           "--strategy", strategy, "--repeats", str(repeats), "--out", str(result), "--root", str(root)]
    subprocess.run(cmd, check=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"})
    out = json.loads(result.read_text())
    for row in out:
        print(json.dumps(row), flush=True)
    return out


def _ckpt_worker(strategy: str, repeats: int, out: Path, root: Path) -> None:
    import torch.distributed as dist
    from hydra import compose, initialize_config_dir

    from distnerf import checkpoint as ckpt
    from distnerf import distributed as D
    from distnerf.config_check import validate
    from distnerf.rundir import resolve_run_dir
    from distnerf.engine.trainer import Trainer
    from distnerf.strategy import build_strategy

    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        cfg = validate(compose("train", overrides=[
            f"strategy={strategy}", f"run_dir={root}/ckpt_{strategy}_run", "model.resolutions=[160]",
            "model.upsample_steps=[]", "train.max_steps=2", "checkpoints.every=-1", "monitor.progress=false",
            "eval.enabled=false", "logger.wandb.mode=disabled", "sampler=sync", "checkpoints.keep=1"]))
    env = D.init_distributed("cpu", timeout_s=cfg.dist_timeout_s, setup_timeout_s=cfg.dist_setup_timeout_s)
    trainer = Trainer(cfg, build_strategy(cfg.strategy, env), resolve_run_dir(cfg, env))
    trainer.fit()  # 2 steps: the optimizer state (Adam moments) exists, as in any later checkpoint
    rows_out = []
    for i in range(repeats):
        trainer.step += 1  # a new step directory each time
        dist.barrier()
        start = time.perf_counter()
        saved = trainer.save_checkpoint()
        seconds = D.all_reduce_max(env, time.perf_counter() - start)  # the slowest rank ends the save
        sizes = {p.name: p.stat().st_size for p in sorted(saved.glob("*")) if p.is_file()}
        start = time.perf_counter()  # the manifest's checksums: part of write_s, timed again alone
        for p in saved.glob("*.pt"):
            ckpt.file_digest(p)
        rows_out.append({"strategy": strategy, "write_s": seconds, "sha256_all_files_s": time.perf_counter() - start,
                         "bytes": sum(sizes.values()), "files": sizes})
    if env.is_main:
        out.write_text(json.dumps(rows_out))
    trainer = None  # its DDP wrapper holds the process group (see D.shutdown)
    if D.shutdown(env):
        print(f"rank {env.rank}: a process group outlived D.shutdown (a DDP wrapper still referenced)",
              file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["first-step", "kill", "ckpt", "_ckpt"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--out", type=Path, help="result JSON (default bench/reliability/results/launch_WHAT[_STRATEGY].json)")
    parser.add_argument("--root", type=Path)
    args = parser.parse_args()
    if args.what == "_ckpt":
        return _ckpt_worker(args.strategy, args.repeats, args.out, args.root)
    meta = start_meta()
    print("load:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)
    root = Path(tempfile.mkdtemp(prefix="bench_launch_"))
    if args.what == "first-step":
        res = bench_first_step(args.repeats, root)
        keys = {"sbatch": ["to_running_s", "to_first_step_s"], "torchrun_local.sh": ["to_first_step_s"]}
        summary = {f"{launcher}/{k}": statistics.median(r[k] for r in res if r["launcher"] == launcher)
                   for launcher, ks in keys.items() for k in ks}
    elif args.what == "kill":
        res = bench_kill(args.repeats, root, args.strategy)
        summary = {k: statistics.median(r[k] for r in res) for k in
                   ("kill_to_resumed_s", "kill_to_first_step_s", "kill_to_kill_step_again_s")}
        summary["steps_repeated"] = [r["kill_step"] - r["resumed_step"] for r in res]
    else:
        res = bench_ckpt(args.strategy, args.repeats, root)
        summary = {"write_s_median": statistics.median(r["write_s"] for r in res),
                   "sha256_s_median": statistics.median(r["sha256_all_files_s"] for r in res),
                   "bytes": res[-1]["bytes"], "files": res[-1]["files"]}
    print("median:", json.dumps(summary))
    print("load:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)
    shutil.rmtree(root, ignore_errors=True)
    name = args.what if args.what == "first-step" else f"{args.what}_{args.strategy}"
    write_result(args.out or default_out(__file__, f"launch_{name}.json"), {"runs": res, "median": summary}, meta)


if __name__ == "__main__":
    main()
