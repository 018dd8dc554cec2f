"""Two nodes, for real, on one machine: two torchrun agents (``launch/torchrun_local.sh`` with
``NNODES=2``, one rank each) in one c10d rendezvous on 127.0.0.1, for ``ddp`` and for ``ss``
with joint training.

What makes each agent a node:

* **its own address.** The c10d rendezvous ranks the nodes by their address, then by the
  agent's pid (torch's ``DynamicRendezvousHandler`` sorts ``addr_pid_id`` descriptors;
  ``--node_rank`` is for the static rendezvous only and ignored here). Each agent is given
  ``--local_addr=127.0.0.1`` or ``127.0.0.2`` (both loopback), so the address decides the
  rank, as host names do on a cluster; swapping the addresses swaps the ranks. The agent
  with 127.0.0.1 starts first and holds the rendezvous endpoint, as node 0 of a cluster does.
* **its own node-local caches**: ``dataset.cache_dir`` (the built-in scene) and
  ``sampler.cache_dir`` (the decoded pixels) in a directory per node, built by the node's
  rank in the first run and kept for the later ones (a node's local disk outlives a job).
* **its own death**: losing a node is SIGKILL of its agent's process group and of every
  process below it (torchrun starts each rank in a session of its own, so the group alone
  would leave the rank running, orphaned).

One chain per strategy, shared by the tests (module-scoped): node A as rank 0 and node B as
rank 1 train (40 steps, a checkpoint every 10) until B is killed after step 22; A's rank must
stop within ``dist_timeout_s`` + 30 s and name rank 1; then both resume with the ranks
swapped (A: rank 1, B: rank 0) and must end bit for bit where an uninterrupted single-node
2-rank run ends; a two-node ``python -m distnerf.render`` of the final checkpoint must write
the same images and metrics as a one-process render of it.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from distnerf import checkpoint as ckpt
from tests.conftest import REPO, free_port
from tests.launch.conftest import (RUN_ENV, alive, descendants, finish, launch_local, last_step,
                                   past_step_with_checkpoint, rows, trainer_ranks, wait_for)

STEPS, EVERY, KILL_AFTER = 40, 10, 22
TIMEOUT_S = 20  # dist_timeout_s: the survivor's bound is this + 30 s
ADDR = ("127.0.0.1", "127.0.0.2")  # the address of the node that becomes rank 0, rank 1
STRATEGIES = {"ddp": ["strategy=ddp"],
              # the sync sampler draws bitwise the batches the pipelined one does (SamplerConfig): the ddp
              # chain covers the sampler workers mapping a node's pixel cache, this one saves their start-up
              "ss_joint": ["strategy=ss", "strategy.training=joint", "sampler=sync"]}
RUN = [f"dist_timeout_s={TIMEOUT_S}", "dist_progress_s=1"]  # progress entries every 1 s: a lost rank falls silent in 3


def listening(port: int) -> bool:
    """Whether a socket of this machine listens on TCP ``port`` (``/proc/net/tcp`` and ``tcp6``)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                return True
    return False


def node_caches(node_dir: Path) -> list[str]:
    return [f"dataset.cache_dir={node_dir / 'scenes'}", f"sampler.cache_dir={node_dir / 'pixels'}"]


def start_nodes(nodes: dict[str, Path], ranks: dict[str, int], start) -> dict:
    """Start one agent per node with ``start(node, node_dir, env)`` (a Popen); node ``n`` joins with
    the address of rank ``ranks[n]``. Rank 0's node starts first and holds the rendezvous endpoint
    before the other starts. Returns ``{node: Popen}``."""
    port, run_id = free_port(), f"rdzv{free_port()}"
    agents = {}
    try:
        for node in sorted(nodes, key=lambda n: ranks[n]):
            env = {**RUN_ENV, "NNODES": "2", "RDZV_ENDPOINT": f"127.0.0.1:{port}", "RDZV_ID": run_id,
                   "MAX_RESTARTS": "0", "TORCHRUN_ARGS": f"--local_addr={ADDR[ranks[node]]}"}
            agents[node] = start(node, nodes[node], env)
            if ranks[node] == 0:
                wait_for(lambda: listening(port) or agents[node].poll() is not None, 60,
                         "node 0's agent to listen on the rendezvous port")
    except BaseException:
        for agent in agents.values():
            os.killpg(agent.pid, signal.SIGKILL)
        raise
    return agents


def lose_node(agent: subprocess.Popen) -> list[int]:
    """SIGKILL the node: its agent's process group and every process below the agent (each rank
    is a session of its own); returns the pids killed."""
    pids = [agent.pid, *descendants(agent.pid)]
    os.killpg(agent.pid, signal.SIGKILL)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def models_of(found: Path) -> dict[str, dict]:
    """``{file: saved dict}`` of the model files of a committed checkpoint (ddp: model.pt; ss: region_K.pt)."""
    files = sorted(found.glob("region_*.pt")) or [found / ckpt.MODEL_FILE]
    return {p.name: torch.load(p, map_location="cpu", weights_only=True) for p in files}


def render_two_nodes(run: Path, nodes: dict[str, Path], ranks: dict[str, int], out_dir: Path, tag: str) -> list[int]:
    """``python -m distnerf.render`` under two agents, each node with its own scene cache; their exit codes."""
    def start(node, node_dir, env):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--rdzv_backend=c10d",
               f"--rdzv_endpoint={env['RDZV_ENDPOINT']}", f"--rdzv_id={env['RDZV_ID']}", env["TORCHRUN_ARGS"],
               "--nproc_per_node=1", "--max-restarts=0", "-m", "distnerf.render", f"run_dir={run}",
               f"out_dir={out_dir}", f"dataset.cache_dir={node_dir / 'scenes'}"]
        return subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **env}, start_new_session=True,
                                stdout=open(run.parent / f"{tag}-{node}.out", "w"), stderr=subprocess.STDOUT)

    agents = start_nodes(nodes, ranks, start)
    return [finish(agents[n], 300, f"two-node render ({n})") for n in sorted(agents)]


@pytest.fixture(scope="module", params=sorted(STRATEGIES))
def strategy(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def node_dirs(strategy, tmp_path_factory) -> dict[str, Path]:
    """The node-local directories of nodes A and B (empty before the chain's first run)."""
    root = tmp_path_factory.mktemp(f"nodes_{strategy}")
    return {"A": root / "A", "B": root / "B"}


@pytest.fixture(scope="module")
def reference(strategy, tmp_path_factory, request) -> Path:
    """The uninterrupted run: one node, 2 ranks (``torchrun --standalone``); ddp's is the session's
    (tests/launch/conftest.py: shared with test_torchrun.py; the chain's timeouts do not enter the model)."""
    if strategy == "ddp":
        return request.getfixturevalue("ddp_reference")
    run = tmp_path_factory.mktemp("reference") / strategy
    proc = launch_local(2, run, STRATEGIES[strategy] + RUN, env={"MAX_RESTARTS": "0"})
    assert finish(proc, 300, f"the uninterrupted {strategy} run") == 0, run.with_suffix(".out").read_text()[-4000:]
    return run


@pytest.fixture(scope="module")
def chain(strategy, node_dirs, tmp_path_factory) -> dict:
    """Two nodes train; node B (rank 1) is lost after step 22; both resume with the ranks swapped;
    the final checkpoint is rendered on two nodes and on one process."""
    root = tmp_path_factory.mktemp("two_nodes")
    run, out = root / strategy, {"strategy": strategy}
    extra = STRATEGIES[strategy] + RUN

    def train(tag):
        return lambda node, node_dir, env: launch_local(1, run, extra + node_caches(node_dir), env=env,
                                                        log=root / f"{tag}-{node}.out")

    def ranks_of(agents):
        return {node: sorted(trainer_ranks(agent.pid, run)) for node, agent in agents.items()}

    started = time.monotonic()
    agents = start_nodes(node_dirs, {"A": 0, "B": 1}, train("first"))
    try:
        wait_for(lambda: past_step_with_checkpoint(run, KILL_AFTER, EVERY), 300,
                 f"step {KILL_AFTER} of the two-node run, its last checkpoint committed")
        out["first_ranks"] = ranks_of(agents)
        out["kill_step"] = last_step(run)
        out["committed_at_kill"] = ckpt.latest(run / "checkpoints")
        out["committed_step"] = ckpt.read_manifest(out["committed_at_kill"])["step"]  # pruned after the resume
        out["killed"] = lose_node(agents["B"])
        killed_at = time.monotonic()
    except BaseException:
        for agent in agents.values():
            os.killpg(agent.pid, signal.SIGKILL)
        raise
    out["survivor_rc"] = finish(agents["A"], TIMEOUT_S + 90, "the surviving node")
    out["survivor_s"] = time.monotonic() - killed_at
    agents["B"].wait()
    out["survivor_log"] = (root / "first-A.out").read_text()
    out["committed_after"] = ckpt.latest(run / "checkpoints")

    agents = start_nodes(node_dirs, {"A": 1, "B": 0}, train("second"))  # swapped
    try:
        out["second_ranks"] = wait_for(lambda: (r := ranks_of(agents)) and all(r.values()) and r, 120,
                                       "a rank under each agent of the resumed run")
    except BaseException:
        for agent in agents.values():
            os.killpg(agent.pid, signal.SIGKILL)
        raise
    out["resumed_rc"] = [finish(agents[n], 300, f"the resumed two-node run ({n})") for n in sorted(agents)]
    out["train_s"] = time.monotonic() - started
    out["logs"] = {p.name: p.read_text() for p in root.glob("*.out")}

    out["render_rc"] = render_two_nodes(run, node_dirs, {"A": 1, "B": 0}, run / "render_two_nodes", "render")
    single = subprocess.run([sys.executable, "-m", "distnerf.render", f"run_dir={run}",
                             f"out_dir={run / 'render_one'}"], cwd=REPO, env={**os.environ, **RUN_ENV},
                            capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-4000:]
    out["run"] = run
    out["total_s"] = time.monotonic() - started
    print(f"\n{strategy}: steps 1..{out['kill_step']} until node B was lost (committed "
          f"{out['committed_at_kill'].name}), survivor out {out['survivor_s']:.1f} s after the kill, "
          f"resumed {[r['step'] for r in rows(run) if r.get('event') == 'resumed']} -> {last_step(run)}; "
          f"training {out['train_s']:.0f} s, with renders {out['total_s']:.0f} s")
    return out


def test_the_surviving_node_stops_within_the_timeout_naming_the_lost_rank(chain):
    assert chain["first_ranks"] == {"A": [0], "B": [1]}, chain["first_ranks"]
    assert chain["survivor_rc"] != 0
    assert chain["survivor_s"] <= TIMEOUT_S + 30, chain["survivor_s"]
    # rank 0's CollectiveFailure names rank 1, whose entries stopped (not a guess from lagging steps)
    said = re.search(r"rank 0: a collective failed \(.*?\); stopped making progress: rank (\S+) \(not heard from",
                     chain["survivor_log"])
    assert said and said.group(1) == "1", chain["survivor_log"][-4000:]
    assert not [pid for pid in chain["killed"] if alive(pid)]
    # no checkpoint was committed after the loss: the one to resume from is the last one before it
    assert chain["committed_after"] == chain["committed_at_kill"]
    assert chain["committed_step"] == chain["kill_step"] // EVERY * EVERY


def test_the_resumed_run_swaps_the_nodes_ranks_and_finishes(chain):
    assert chain["second_ranks"] == {"A": [1], "B": [0]}, chain["second_ranks"]
    assert chain["resumed_rc"] == [0, 0], chain["logs"]["second-A.out"][-3000:]
    resumed = [r for r in rows(chain["run"]) if r.get("event") == "resumed"]
    assert [(r["step"], r["checkpoint"]) for r in resumed] == [(chain["committed_step"],
                                                                 chain["committed_at_kill"].name)]
    manifest = ckpt.read_manifest(ckpt.latest(chain["run"] / "checkpoints"), verify=True)
    assert manifest["step"] == STEPS and manifest["world_size"] == 2
    assert (chain["run"] / "metrics.json").exists()


def test_the_resumed_run_ends_bit_exact_with_the_uninterrupted_one(chain, reference):
    ours, theirs = (models_of(ckpt.latest(r / "checkpoints")) for r in (chain["run"], reference))
    assert ours.keys() == theirs.keys() and ours, (ours.keys(), theirs.keys())
    for name in ours:
        a, b = ours[name], theirs[name]
        assert a["step"] == b["step"] == STEPS, name
        assert a["model"].keys() == b["model"].keys(), name
        for k in a["model"]:
            assert torch.equal(a["model"][k], b["model"][k]), f"{name}: {k}"


def test_each_node_builds_its_own_caches_once_and_keeps_them_across_the_swap(chain, node_dirs):
    """Every rank that builds a pixel cache says so on its console: each node's file is built by
    that node's rank of the first run, in the node's own directory, and mapped by the resumed
    run's rank on that node (the other rank now) without a rebuild."""
    built = {}
    for name, text in chain["logs"].items():
        for path in re.findall(r"building the pixel cache (\S+)", text):
            built.setdefault(Path(path).parent.parent.name, []).append(name)
    assert built == {"A": ["first-A.out"], "B": ["first-B.out"]}, built
    for node_dir in node_dirs.values():
        assert len(sorted((node_dir / "pixels").glob("pixels-*.npy"))) == 1, node_dir
        assert len(sorted((node_dir / "scenes").glob("objects_*"))) == 1, node_dir


def test_a_two_node_render_matches_the_one_process_render(chain):
    assert chain["render_rc"] == [0, 0], chain["run"].parent.joinpath("render-A.out").read_text()[-3000:]
    two, one = chain["run"] / "render_two_nodes", chain["run"] / "render_one"
    m2, m1 = (json.loads((d / "metrics.json").read_text()) for d in (two, one))
    assert m2["step"] == m1["step"] == STEPS
    assert m2["psnr"] == pytest.approx(m1["psnr"], abs=1e-6)
    pngs = sorted(p.name for p in (one / "test").glob("*.png"))
    assert pngs and pngs == sorted(p.name for p in (two / "test").glob("*.png"))
    for name in pngs:
        assert (two / "test" / name).read_bytes() == (one / "test" / name).read_bytes(), name
