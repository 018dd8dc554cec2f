"""The launch/ Slurm scripts on a real single-node Slurm (``slurm`` fixture).

* ``slurm_train.sbatch``: a 2-rank CPU job gets the preemption warning on a non-default
  signal (``PREEMPT_SIGNAL=USR2``; ``scancel --signal=USR2 --batch``, what ``--signal=B:USR2@T``
  delivers), all ranks
  checkpoint at one step, the job requeues itself and the requeued job resumes there and
  finishes; ``slurm_render.sbatch`` then renders the run.
* ``slurm_multinode.sbatch`` on one node (``srun torchrun`` with a c10d rendezvous on the
  head node of the allocation): the warning goes through srun and the agent to the ranks,
  the job requeues and resumes; a plain ``scancel`` (SIGTERM) then ends it in a checkpoint.
* Every script's resources: GPUs and CPUs per rank requested by default (``#SBATCH`` lines; the
  GPU-less cluster here refuses them, ``--gpus-per-node=0`` is accepted: ``sbatch --test-only``),
  and its srun/torchrun command line under a fake GPU allocation (``DRY_RUN=1``): ranks per
  GPU, NUMA binding, the multi-node rendezvous for a two-node allocation (built, not run).
"""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from distnerf import checkpoint as ckpt
from tests.conftest import REPO, free_port
from tests.launch.conftest import SMOKE, last_step, rows, wait_for

FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
CPU_JOB = ["--gpus-per-node=0", "--cpus-per-task=2", "--ntasks-per-node=1"]  # 2 CPU ranks on this node (no GPU here)
SCRIPTS = ("slurm_train.sbatch", "slurm_multinode.sbatch", "slurm_render.sbatch")


@pytest.fixture(scope="module")
def preempted(slurm, tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm_train")
    run, out = root / "run", root / "train.out"
    job = slurm.sbatch("slurm_train.sbatch", [*SMOKE, "train.max_steps=60", "checkpoints.every=20"],
                       [*CPU_JOB, "--signal=B:USR2@30", f"--output={out}"],
                       {"NPROC": "2", "RUN_DIR": str(run), "PREEMPT_SIGNAL": "USR2"})
    wait_for(lambda: last_step(run) >= 12, 240, f"step 12 of job {job} ({out})")
    slurm.cmd("scancel", "--signal=USR2", "--batch", job)  # a non-default preemption signal
    info = slurm.wait_state(job, FINAL, 300)
    render_out = root / "render.out"
    render = slurm.sbatch("slurm_render.sbatch", [str(run)], [*CPU_JOB, f"--output={render_out}"], {"NPROC": "2"})
    render_info = slurm.wait_state(render, FINAL, 240)
    return {"job": job, "info": info, "run": run, "out": out.read_text(), "render": render_info,
            "render_out": render_out.read_text()}


def test_preempted_job_checkpoints_requeues_and_resumes(preempted):
    info, run = preempted["info"], preempted["run"]
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, preempted["out"][-3000:])
    assert info["Restarts"] == "1"
    assert f"requeueing job {preempted['job']} (restart 0 -> 1)" in preempted["out"]
    events = rows(run)
    stops = [r for r in events if r.get("event") == "signal_stop"]
    assert len(stops) == 1 and stops[0]["signal"] == "SIGUSR2", stops
    k = stops[0]["step"]
    assert k >= 12 and k % 20 != 0  # the agreed stop step, not a periodic checkpoint
    resumes = [r["step"] for r in events if r.get("event") == "resumed"]
    assert resumes == [k], resumes  # one resume, after the requeue: no exit abort restarted the group
    assert [r["step"] for r in events if "loss" in r] == list(range(1, 61))
    assert ckpt.read_manifest(ckpt.latest(run / "checkpoints"))["step"] == 60
    assert (run / "metrics.json").exists()


def test_render_job_scores_the_run(preempted):
    import json

    info = preempted["render"]
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, preempted["render_out"][-3000:])
    trained = json.loads((preempted["run"] / "metrics.json").read_text())
    rendered = json.loads((preempted["run"] / "render" / "metrics.json").read_text())
    assert rendered["step"] == 60 and rendered["psnr"] == pytest.approx(trained["psnr"], abs=1e-6)


def test_multinode_script_on_one_node_preempted_requeued_then_cancelled(slurm, tmp_path):
    """srun forwards the warning to the agent, the agent to its ranks; the requeued job resumes;
    a plain scancel (SIGTERM) of the resumed job ends in a checkpoint too, without a requeue."""
    run, out = tmp_path / "run", tmp_path / "mn.out"
    job = slurm.sbatch("slurm_multinode.sbatch", [*SMOKE, "train.max_steps=100000", "checkpoints.every=1000"],
                       ["--nodes=1", *CPU_JOB, f"--output={out}"],
                       {"NPROC": "2", "RUN_DIR": str(run), "RDZV_PORT": str(free_port())})
    wait_for(lambda: last_step(run) >= 8, 240, f"step 8 of job {job} ({out})")
    slurm.cmd("scancel", "--signal=USR1", "--batch", job)
    resumed = wait_for(lambda: [r for r in rows(run) if r.get("event") == "resumed"], 240,
                       f"the requeued job {job} to resume ({out})")
    wait_for(lambda: last_step(run) > resumed[0]["step"] + 2, 120, "steps after the resume")
    slurm.cmd("scancel", job)  # SIGTERM to the batch shell and every process of the job
    info = slurm.wait_state(job, FINAL, 120)
    text = out.read_text()
    assert info["JobState"] == "CANCELLED" and info["Restarts"] == "1", (info, text[-3000:])
    assert f"(head {slurm.cmd('hostname', '-s').strip()})" in text  # the head from the node list
    stops = [r for r in rows(run) if r.get("event") == "signal_stop"]
    assert [s["signal"] for s in stops] == ["SIGUSR1", "SIGTERM"], (stops, text[-3000:])
    assert resumed[0]["step"] == stops[0]["step"]
    manifest = ckpt.read_manifest(ckpt.latest(run / "checkpoints"), verify=True)
    assert manifest["step"] == stops[1]["step"] > stops[0]["step"] and manifest["world_size"] == 2
    assert text.count("requeueing") == 1  # after the warning, not after the cancel


def sbatch_options(script: str) -> dict[str, str]:
    """The active ``#SBATCH --key=value`` lines of ``launch/<script>`` (``##SBATCH`` lines are comments)."""
    text = (REPO / "launch" / script).read_text()
    return dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?", text, flags=re.M))


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_request_gpus_and_cpus_for_ranks_and_workers(script):
    from distnerf.schema import SamplerConfig

    opts = sbatch_options(script)
    gpus, cpus = int(opts["gpus-per-node"]), int(opts["cpus-per-task"])
    assert gpus >= 1 and opts["ntasks-per-node"] == "1"  # one task (the torchrun agent) holds the node's GPUs
    assert cpus >= gpus * (1 + SamplerConfig().num_workers), opts  # a rank's main thread and its sampler workers


@pytest.mark.parametrize("script", SCRIPTS)
def test_gpus_by_default_and_the_cpu_override_on_a_gpu_less_cluster(slurm, script):
    def test_only(*options):
        return subprocess.run(["sbatch", "--test-only", *options, str(REPO / "launch" / script)], cwd=REPO,
                              env=slurm.env, capture_output=True, text=True, timeout=60)

    default = test_only()
    assert default.returncode != 0 and "generic resource" in default.stderr, default.stderr  # GPUs asked for
    cpu = test_only(*CPU_JOB, *(["--nodes=1"] if script == "slurm_multinode.sbatch" else []))  # one node here
    assert cpu.returncode == 0 and "to start" in cpu.stderr, cpu.stderr


def dry_run(script: str, tmp_path, env: dict, args: list[str], slurm_conf: dict | None = None) -> list[str]:
    """``DRY_RUN=1 bash launch/<script> ARGS`` in a fake allocation (a ``numactl`` stub on PATH; ``slurm_conf``:
    the cluster's ``SLURM_CONF`` for ``scontrol``); its command line, split."""
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "numactl").write_text("#!/bin/sh\nexit 0\n")
    (stub / "numactl").chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NPROC", "NUMA_BINDING"))}
    full = {**base, "PATH": f"{stub}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[07-08]",
            "SLURM_JOB_NUM_NODES": "2", "DRY_RUN": "1", "DISTNERF_ROOT": str(REPO), "RDZV_PORT": "29611",
            **(slurm_conf or {}), **env}
    proc = subprocess.run(["bash", str(REPO / "launch" / script), *args], env=full, capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    print(f"{script} dry run ({' '.join(f'{k}={v}' for k, v in env.items())}): {proc.stdout.strip()}")
    return proc.stdout.split()


GPU_NODE = {"SLURM_GPUS_ON_NODE": "4", "SLURM_CPUS_PER_TASK": "32"}  # what Slurm sets for --gpus-per-node=4


def test_multinode_command_line_for_two_nodes(slurm, tmp_path):
    conf = {"SLURM_CONF": slurm.env["SLURM_CONF"]}  # scontrol (the head node from the node list) reads it
    line = dry_run("slurm_multinode.sbatch", tmp_path, GPU_NODE, ["train.max_steps=10"], conf)
    assert line[:4] == ["srun", "--ntasks-per-node=1", "--cpus-per-task=32", "--kill-on-bad-exit=1"]
    for arg in ("--nnodes=2", "--nproc_per_node=4", "--numa-binding=node", "--rdzv_backend=c10d",
                "--rdzv_endpoint=gpu07:29611", "--rdzv_id=4242", "distnerf.train", "run_dir=runs/slurm-4242",
                "resume=true", "train.max_steps=10"):
        assert arg in line, (arg, line)
    # without --cpus-per-task the agent gets the node's CPUs in the job, not one
    line = dry_run("slurm_multinode.sbatch", tmp_path, {"SLURM_GPUS_ON_NODE": "4", "SLURM_CPUS_ON_NODE": "48"}, [], conf)
    assert "--cpus-per-task=48" in line


@pytest.mark.parametrize("script, args, module", [("slurm_train.sbatch", ["train.max_steps=10"], "distnerf.train"),
                                                  ("slurm_render.sbatch", ["runs/r", "eval.num_views=2"], "distnerf.render")])
def test_single_node_command_lines(tmp_path, script, args, module):
    line = dry_run(script, tmp_path, GPU_NODE, args)
    assert line[:5] == ["python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4"], line
    assert "--numa-binding=node" in line and line[line.index("-m", 3) + 1] == module and line[-1] == args[-1]
    # CPU ranks (--gpus-per-node=0): NPROC ranks, no NUMA binding (no GPU to be near)
    line = dry_run(script, tmp_path, {"SLURM_GPUS_PER_NODE": "0", "SLURM_CPUS_PER_TASK": "2", "NPROC": "2"}, args)
    assert "--nproc_per_node=2" in line and not any(a.startswith("--numa-binding") for a in line)
    line = dry_run(script, tmp_path, {**GPU_NODE, "NUMA_BINDING": "none"}, args)
    assert "--nproc_per_node=4" in line and not any(a.startswith("--numa-binding") for a in line)
