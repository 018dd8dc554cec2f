"""Loading a finished (or running) run for inference: its config, its newest committed
checkpoint, and the module that renders rays from it (the model, or an ``ss`` run's
fusion stage). Shared by ``distnerf.render``, ``distnerf.export`` and ``distnerf.view``.
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from .. import checkpoint as ckpt
from ..model import build_model
from ..config_check import ConfigError, refuse_moved_keys, upgrade_config, validate
from ..schema import RenderConfig


def load_run_config(argv: list[str], prog: str = "distnerf.render"):
    """(config, run_dir) from ``run_dir=PATH`` and overrides on the command line.

    Args:
        argv: ``key=value`` items, one of them ``run_dir=PATH``.
        prog: the entry point named in the usage message.
    Raises:
        ValueError: no ``run_dir=``; FileNotFoundError: no ``config.yaml`` in it.
    """
    cli = OmegaConf.from_dotlist(argv)
    run_dir = cli.get("run_dir")
    if not run_dir:
        raise ValueError(f"usage: python -m {prog} run_dir=PATH [key=value ...]")
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        raise FileNotFoundError(f"{path}: not a distnerf run directory (no config.yaml)")
    try:
        refuse_moved_keys(argv)
        # a run directory from before the train section was split by concern: its keys moved first
        cfg = validate(OmegaConf.merge(upgrade_config(OmegaConf.load(path)), cli), root=RenderConfig)
    except ConfigError as err:
        raise ConfigError(f"{path} with {' '.join(argv)}: {err}") from None
    return cfg, Path(run_dir).resolve()


def find_checkpoint(cfg, run_dir: Path) -> tuple[Path, dict]:
    """The checkpoint to render (``cfg.checkpoint`` or the newest committed) and its verified manifest.

    Raises:
        FileNotFoundError: no committed checkpoint; CheckpointError: the newest is damaged.
    """
    found = Path(cfg.checkpoint) if cfg.checkpoint else ckpt.latest(run_dir / "checkpoints")
    if found is None:
        broken = ckpt.damaged(run_dir / "checkpoints")
        if broken:  # committed, then damaged: say which file, not "no checkpoint"
            raise ckpt.CheckpointError(f"{run_dir / 'checkpoints'}: no usable checkpoint; the newest: {broken[-1]}")
        raise FileNotFoundError(f"{run_dir / 'checkpoints'}: no committed checkpoint to render")
    return found, ckpt.read_manifest(found, verify=True)


def load_weights(cfg, run_dir: Path):
    """Model state and step: ``cfg.weights`` (an export) or the newest checkpoint."""
    if cfg.weights:
        blob = ckpt.load_file(cfg.weights)
        return blob["model"], int(blob["step"])
    found, manifest = find_checkpoint(cfg, run_dir)
    if manifest["strategy"] != "ddp":
        raise ValueError(f"{found}: a {manifest['strategy']} checkpoint has no single {ckpt.MODEL_FILE}; "
                         f"render it through its fusion stage (python -m distnerf.render run_dir=...)")
    state = ckpt.load_file(found / ckpt.MODEL_FILE)
    return state["model"], int(state["step"])


def load_renderer(cfg, run_dir: Path, scene, env):
    """(module that renders rays, step): the model, or the fusion stage of an ``ss`` run.

    The module maps a :class:`~distnerf.data.rays.RayBundle` of R rays to ``rgb`` (R, 3),
    ``depth`` (R,) and ``opacity`` (R,); an ``ss`` one has a ``partition`` attribute
    (:class:`~distnerf.strategy.partition.Partition`).

    Args:
        cfg: the run's config (:func:`load_run_config`); ``cfg.checkpoint`` picks a checkpoint.
        scene: any split of the run's scene (its box and background are used).
        env: this process's :class:`~distnerf.distributed.DistEnv`.
    """
    if cfg.strategy.name == "ss":
        from ..strategy.ss_loading import load_fused, region_states, shared_state

        if cfg.weights:  # a fused export: every region's sub-model in one file
            blob = ckpt.load_file(cfg.weights)
            partition, state, step = blob["partition"], blob["regions"].__getitem__, int(blob["step"])
            shared = blob.get("shared")
        else:
            found, manifest = find_checkpoint(cfg, run_dir)
            partition, state, step = manifest["partition"], region_states(found), int(manifest["step"])
            shared = shared_state(found)
        fused = load_fused(partition, state, cfg.model, cfg.strategy,
                           scene.aabb, scene.background, cfg.fusion or cfg.strategy.fusion, env, shared)
        return fused, step
    state, step = load_weights(cfg, run_dir)
    model = build_model(cfg.model, scene.aabb, scene.background)
    model.load_state_dict(state)
    return model.to(env.device).eval(), step
