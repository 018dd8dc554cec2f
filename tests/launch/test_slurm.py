"""The launch/ Slurm scripts on a real single-node Slurm (``slurm`` fixture).

* ``slurm_train.sbatch``: a 2-rank CPU job gets the preemption warning on a non-default
  signal (``PREEMPT_SIGNAL=USR2``; ``scancel --signal=USR2 --batch``, what ``--signal=B:USR2@T``
  delivers), all ranks
  checkpoint at one step, the job requeues itself and the requeued job resumes there and
  finishes; ``slurm_render.sbatch`` then renders the run.
* ``slurm_multinode.sbatch`` on one node (``srun torchrun`` with a c10d rendezvous on the
  head node of the allocation): the warning goes through srun and the agent to the ranks,
  the job requeues and resumes; a plain ``scancel`` (SIGTERM) then ends it in a checkpoint.
* The multi-node command line for a two-node allocation (built, not run: one node here).
"""
from __future__ import annotations

import subprocess

import pytest

from distnerf import checkpoint as ckpt
from tests.conftest import REPO, free_port
from tests.launch.conftest import SMOKE, last_step, rows, wait_for

FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
CPU_JOB = ["--cpus-per-task=2", "--ntasks-per-node=1"]  # 2 CPU ranks on this node


@pytest.fixture(scope="module")
def preempted(slurm, tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm_train")
    run, out = root / "run", root / "train.out"
    job = slurm.sbatch("slurm_train.sbatch", [*SMOKE, "train.max_steps=60", "train.ckpt_every=20"],
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
    job = slurm.sbatch("slurm_multinode.sbatch", [*SMOKE, "train.max_steps=100000", "train.ckpt_every=1000"],
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


def test_multinode_command_line_for_two_nodes(slurm):
    env = {**slurm.env, "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_NUM_NODES": "2",
           "SLURM_GPUS_ON_NODE": "4", "SLURM_CPUS_PER_TASK": "16", "DRY_RUN": "1", "DISTNERF_ROOT": str(REPO), "RDZV_PORT": "29611"}
    env.pop("NPROC", None)
    proc = subprocess.run(["bash", str(REPO / "launch" / "slurm_multinode.sbatch"), "train.max_steps=10"], env=env,
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.split()
    assert line[:4] == ["srun", "--ntasks-per-node=1", "--cpus-per-task=16", "--kill-on-bad-exit=1"]
    for arg in ("--nnodes=2", "--nproc_per_node=4", "--rdzv_backend=c10d", "--rdzv_endpoint=gpu07:29611",
                "--rdzv_id=4242", "distnerf.train", "run_dir=runs/slurm-4242", "resume=true", "train.max_steps=10"):
        assert arg in line, (arg, line)
