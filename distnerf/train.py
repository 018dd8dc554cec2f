"""Train a NeRF: ``python -m distnerf.train [overrides]``.

Examples::

    python -m distnerf.train                                   # built-in scene, grid model
    python -m distnerf.train dataset=blender dataset.root=../shared/data/nerf_synthetic_half/lego
    python -m distnerf.train dataset=llff dataset.root=../shared/data/nerf_llff_data/fern
    torchrun --nproc_per_node=2 -m distnerf.train strategy=ddp run_dir=runs/lego2
    python -m distnerf.train run_dir=runs/lego2 resume=true   # continue a run
    launch/torchrun_local.sh 2 runs/lego2 -- dataset=blender ...  # restarts + auto-resume (launch/ for Slurm)

Flow: compose config -> init distributed -> run directory -> Trainer (dataset,
sampler, model, strategy.wrap, optimizer, checkpoint) -> fit -> evaluate.
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from . import cpu

WAIT = cpu.choose_wait()  # before torch loads its OpenMP runtime, which reads the wait once (distnerf/cpu.py)

import hydra  # noqa: E402
import torch  # noqa: E402
from omegaconf import DictConfig, OmegaConf
from torch.distributed.elastic.multiprocessing.errors import record

from . import cli as C
from . import distributed as D
from .checkpoint import CheckpointError
from .fileio import CheckpointWriteError
from .rundir import RunDirBusy, release_run_dir, resolve_run_dir, setup_logging
from .data import DatasetError
from .config_check import GROUPS, ConfigError, derive, validate
from .engine.trainer import NonFiniteLoss, Trainer
from .observe.progress import PROGRESS_DIR, ProgressBeacon
from .components.sample_budget import STATIC_RAYS_PER_RANK, static_by_default
from .sampler import auto_kind
from .schema import TrainConfig
from .strategy import build_strategy

log = logging.getLogger("distnerf")


class CollectiveFailure(RuntimeError):
    """A collective timed out or lost a peer; the message names each rank's step and phase and
    the rank that stopped making progress (:class:`distnerf.observe.progress.ProgressBeacon`)."""


@record  # under torchrun a rank's exception (with traceback) goes to its error file and the agent's summary
def run(cfg: DictConfig) -> dict:
    # the one validation of the run (schemas: distnerf/schema.py; errors name the key, the value, what is
    # allowed): everything below takes this typed config as it is, and derives from it (config_check.derive)
    cfg = validate(cfg)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    if cfg.step.deterministic:  # before any CUDA work: cuBLAS reads its workspace setting at start
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    stop = D.StopRequest().install()  # SIGUSR1/SIGTERM: all ranks stop at one step and checkpoint
    env = D.init_distributed(cfg.device, timeout_s=cfg.dist_timeout_s, setup_timeout_s=cfg.dist_setup_timeout_s,
                             backend=cfg.dist_backend)
    threads_before = torch.get_num_threads()
    agent = D.AgentWatch(D.torchrun_agent_pid(), env.rank).start()  # its torchrun agent dies: stop, named
    beacon = ProgressBeacon(env.store, env.rank, env.world_size, cfg.dist_progress_s).start()  # step and phase, for hang reports
    if cfg.sampler.name == "auto":  # the sampler this device runs, named in the run's config.yaml
        cfg = derive(cfg, sampler=derive(cfg.sampler, name=auto_kind(env.device, cfg.sampler.source)))
    if cfg.train.rays_per_rank is None and cfg.train.global_rays is None and static_by_default(cfg, env.device):
        # the static step's batch (its budget marches from it), named in the run's config.yaml: a resume keeps it
        cfg = derive(cfg, train=derive(cfg.train, rays_per_rank=STATIC_RAYS_PER_RANK))
    run_dir = strategy = trainer = None
    finished = False
    try:
        run_dir = resolve_run_dir(cfg, env)
        setup_logging(env, run_dir, cfg.logger.level)
        threads = cpu.configure(cfg.num_threads, env.local_world_size, warn=env.local_rank == 0)  # the node's cores shared
        if env.has_peers:  # each rank's progress also in RUN/progress/: readable when the store's node is lost
            beacon.record_to(run_dir / PROGRESS_DIR)
        if env.is_main:
            (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
            log.info("run directory %s; world size %d; backend %s; device %s", run_dir, env.world_size,
                     env.backend or "none", env.device)
            log.info("threads: %s (the wait chosen at start-up: %s)", threads.describe(), WAIT)
        strategy = build_strategy(cfg.strategy, env)
        trainer = Trainer(cfg, strategy, run_dir, stop=stop)
        if WAIT == "spin" and threads.source == "cores / local ranks" and not cfg.step.deterministic:
            # spinning threads beside a process that arrives later: fewer threads while it shares the cores
            trainer.phase_hooks.append(cpu.CoreWatch(threads.threads, D.torchrun_agent_pid() or os.getpid()).phase_hook)
        D.end_setup(env, cfg.dist_setup_timeout_s, cfg.dist_timeout_s)  # names late ranks; then the step timeout
        beacon.watch(trainer.activity)
        result = trainer.fit()
        finished = True
        return result
    except BaseException as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        collective = isinstance(err, RuntimeError) and env.distributed and D.collective_failure(err)
        if collective:  # name the rank that stopped making progress, not only the one whose wait timed out
            report = beacon.report(peer_lost=D.peer_lost(err))
            msg = f"rank {env.rank}: a collective failed ({first[:300]}); {report.text}"
            log.error(msg)
        if trainer is not None and collective:  # a live page says why the run stopped before its server closes
            trainer.close_viewer(f"**stopped** at step {trainer.step}", report.short)
        elif trainer is not None:
            trainer.close_viewer(f"**stopped** at step {trainer.step}",
                                 f"{type(err).__name__}: {first[:300]}" if str(err).strip() else first)
        if collective:
            raise CollectiveFailure(msg) from err
        raise
    finally:
        if run_dir is not None:
            release_run_dir(run_dir)
        beacon.stop()  # joined before the process group goes
        agent.stop()
        torch.set_num_threads(threads_before)
        torch.use_deterministic_algorithms(was_deterministic)
        strategy = trainer = None  # their DDP wrapper holds the process group: dropped first (D.shutdown)
        if D.shutdown(env) and finished:  # (an exception in flight holds the trainer's frames: expected then)
            log.warning("rank %d: a process group is still referenced after shutdown; its gloo threads may "
                        "abort the interpreter's exit", env.rank)
        stop.uninstall()


CONF = Path(__file__).resolve().parents[1] / "conf"


@hydra.main(config_path=str(CONF), config_name="train", version_base="1.3")  # absolute: also when imported (distnerf-train)
def main(cfg: DictConfig) -> None:
    COMMAND_LINE.started()  # Hydra composed the config (cli: what it wrote to stderr goes out)
    try:
        run(cfg)
    except ConfigError as err:  # a key's value: a usage error, one line, exit 2
        ENTRY.error(err)
    except (NonFiniteLoss, DatasetError, RunDirBusy, CheckpointWriteError, CheckpointError) as err:  # the message says it all
        raise SystemExit(f"distnerf: {err}") from None


def _keys(argv) -> str:
    """``--help``'s keys: the groups, the root and loop keys, and the keys of the dataset, model and
    strategy options chosen on the command line (the defaults otherwise)."""
    chosen = dict(a.split("=", 1) for a in argv if "=" in a and a.split("=", 1)[0] in (*GROUPS, "experiment"))
    groups = C.config_groups(CONF, "train", chosen)
    picked = {g.name.split("=")[0]: g.name.split("=")[1] for g in groups}
    parts = ["  groups (group=option; the default shown, or the one on the command line):",
             C.format_keys(groups, indent=4), "", C.format_keys(C.schema_keys(TrainConfig))]
    for group, options in GROUPS.items():
        if picked.get(group) in options:
            parts += ["", f"  {group}.* of {group}={picked[group]}:",
                      C.format_keys(C.schema_keys(options[picked[group]], f"{group}."))]
    return "\n".join(parts)


ENTRY = C.Entry(
    "train", __doc__.splitlines()[0].split(":")[0] + " (Hydra: config conf/train.yaml, key=value overrides).",
    "[group=option ...] [key=value ...]", _keys,
    examples=["                    # the built-in scene, grid model, 1000 steps", "dataset=blender dataset.root=../shared/data/nerf_synthetic_half/lego",
              "model=ngp train.max_steps=2000 run_dir=runs/ngp", "run_dir=runs/ngp resume=true",
              "--help model=nerf    # the keys of another option",
              "--cfg job dataset=llff dataset.root=PATH   # print the composed config (Hydra)"],
    notes="Defaults as declared in distnerf/schema.py (a group file, conf/GROUP/OPTION.yaml, changes a few: "
          "--cfg job prints the composed values). Multi-process: torchrun --nproc_per_node=N -m distnerf.train ...; "
          "Hydra's own help: --hydra-help.")


COMMAND_LINE = C.HydraCommandLine(ENTRY, CONF, "train", validate)


def cli(argv: list[str] | None = None) -> None:
    """``distnerf-train`` / ``python -m distnerf.train``: ``--help``, then :func:`main` (Hydra) on the
    overrides; an unknown key or option, a wrong value: one line, exit 2."""
    COMMAND_LINE.run(main, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    cli()
