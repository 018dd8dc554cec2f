"""Config validation: a composed (or saved) config merged into the schemas of :mod:`distnerf.schema`
(the list of keys, their defaults and bounds) and checked, and the schemas registered with Hydra.

:func:`validate` merges a whole config into the schemas and checks every declared choice and
bound, raising :class:`ConfigError` (a ``ValueError``) naming the key, the value and what is
allowed; an entry point runs it once and passes the typed result down. :func:`section` does the
same for one group (components build their settings with it; a node of the validated config
passes through as it is), and :func:`derive` makes a sub-configuration of a validated node
(``ss``'s per-region model, a parameter budget's probe) without merging it into the schema again.
Types are checked by OmegaConf on merge (a string for an int key is an error naming the key),
unknown keys are refused (struct mode). Importing this module registers the schemas in Hydra's
ConfigStore (``schema_train``, ``<group>/schema_<option>``) and the ``distnerf_schedule``
resolver of ``optim.schedule`` (:func:`describe_schedule`), so every entry point that composes
``conf/train.yaml`` imports it.
"""
from __future__ import annotations

import copy
import dataclasses

from omegaconf import MISSING, DictConfig, OmegaConf

from .schema import (DEFAULT_MAX_STEPS, DEFAULT_RAYS_PER_RANK, BlenderDataset, ColmapDataset, DDPStrategyConfig, EvalConfig,
                     GridModelConfig, LLFFDataset, LoggerConfig, NeRFModelConfig, NerfstudioDataset,
                     NGPModelConfig, ProfilerConfig, SamplerConfig, SSStrategyConfig, SyntheticDataset,
                     TraceConfig, TrainConfig, TrainLoopConfig, ViewerConfig, OptimConfig, StepConfig,
                     CheckpointsConfig, MonitorConfig)


class ConfigError(ValueError):
    """A config key is unknown, missing, of the wrong type or out of range (the message names it)."""


MOVED_TRAIN_KEYS = {
    "lr": "optim.lr", "betas": "optim.betas", "eps": "optim.eps", "fused": "optim.fused",
    "decay": "optim.decay", "decay_steps": "optim.decay_steps", "decay_start": "optim.decay_start",
    "warmup_steps": "optim.warmup_steps", "schedule_steps": "optim.schedule_steps", "schedule": "optim.schedule",
    "samples_per_step": "step.samples_per_step", "cuda_graph": "step.cuda_graph",
    "graph_probe_every": "step.probe_every", "bf16": "step.bf16", "deterministic": "step.deterministic",
    "ckpt_every": "checkpoints.every", "ckpt_every_minutes": "checkpoints.every_minutes",
    "ckpt_minutes": "checkpoints.at_minutes", "keep_checkpoints": "checkpoints.keep",
    "ckpt_async": "checkpoints.background",
    "log_every": "monitor.log_every", "val_every": "monitor.val_every", "val_views": "monitor.val_views",
    "progress": "monitor.progress",
}
"""The keys that left the ``train`` section when it was split by concern (``train.lr`` is ``optim.lr``):
old name (under ``train``) -> new dotted key. A run directory's ``config.yaml`` written before the split is
read through :func:`upgrade_config`; an old key on a command line is refused naming its new key
(:func:`refuse_moved_keys`)."""


def upgrade_config(cfg):
    """A whole run config (a mapping: a run directory's saved ``config.yaml``) in the current layout: each key of
    :data:`MOVED_TRAIN_KEYS` moved from ``train`` to its section (a config already in it comes back unchanged).

    Returns:
        a new ``DictConfig`` (interpolations kept unresolved).
    """
    data = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else copy.deepcopy(dict(cfg))
    train = data.get("train")
    for old in [k for k in train if k in MOVED_TRAIN_KEYS] if isinstance(train, dict) else []:
        group, key = MOVED_TRAIN_KEYS[old].split(".")
        data.setdefault(group, {})[key] = train.pop(old)
    return OmegaConf.create(data)


def upgrade_overrides(overrides) -> list[str]:
    """``key=value`` overrides with every moved ``train`` key (:data:`MOVED_TRAIN_KEYS`) named by its new key
    (``train.lr=0.01`` -> ``optim.lr=0.01``; a ``+``/``~`` prefix kept): a study cell's recorded overrides from
    before the split, compared with its plan."""
    out = []
    for item in overrides:
        item = str(item)
        sign = item[:len(item) - len(item.lstrip("+~"))]
        key, eq, value = item[len(sign):].partition("=")
        new = MOVED_TRAIN_KEYS.get(key[len("train."):]) if key.startswith("train.") else None
        out.append(f"{sign}{new}{eq}{value}" if new else item)
    return out


def refuse_moved_keys(overrides) -> None:
    """Refuse a command line's old ``train`` key (:data:`MOVED_TRAIN_KEYS`), naming the key to type instead.

    Raises:
        ConfigError: ``config train.lr moved to optim.lr ...``.
    """
    for item in overrides:
        key = str(item).lstrip("+~").partition("=")[0]
        if key.startswith("train.") and key[len("train."):] in MOVED_TRAIN_KEYS:
            new = MOVED_TRAIN_KEYS[key[len("train."):]]
            raise ConfigError(f"config {key} moved to {new} (the train section holds the batch and the run's "
                              f"length only): write {new}={str(item).partition('=')[2]}")


def choices_of(schema: type, key: str) -> tuple:
    """The allowed values of a :func:`~distnerf.schema.choice` field, e.g. ``choices_of(SamplerConfig, "policy")``."""
    return next(f for f in dataclasses.fields(schema) if f.name == key).metadata["choices"]


def describe_schedule(max_steps, max_minutes, decay, decay_steps, warmup_steps, schedule_steps,
                      upsample_steps=None, occupancy_every=None, decay_start=0.0) -> str:
    """The training schedule's rule, resolved for these ``train`` values (and the model's stage
    steps and occupancy cadence, where the model has them), as one line: the value of
    ``optim.schedule`` (``--cfg job --resolve``). What computes it: :mod:`distnerf.components.schedule`.

    Without a time budget (``max_minutes`` 0) everything follows the step; with one, ``p``, the
    fraction of the budget elapsed: ``lr x decay ** (max(p - decay_start, 0) / (1 - decay_start))``
    (constant until ``p = decay_start``), grid stage ``i`` at step
    ``upsample_steps[i]`` (with ``schedule_steps`` set, also at ``p >= upsample_steps[i] /
    schedule_steps``, whichever first). Warm-up and the occupancy refresh count steps in both."""
    warm = f"; linear warm-up over {warmup_steps} steps" if warmup_steps else ""
    occ = f"; occupancy refresh every {occupancy_every} steps" if occupancy_every else ""
    stages = list(upsample_steps) if upsample_steps else []
    if not max_minutes or float(max_minutes) <= 0:
        limit = DEFAULT_MAX_STEPS if max_steps is None else int(max_steps)
        at = f"; grid stages at steps {stages}" if stages else ""
        if decay_steps is None:
            start = float(decay_start or 0.0)
            lr = (f"lr x {float(decay):g} ** (step / {limit})" if start == 0 else
                  f"lr constant until step {round(start * limit)}, then x {float(decay):g} ** "
                  f"((step / {limit} - {start:g}) / {1 - start:g})")
        else:
            lr = f"lr x {float(decay):g} ** (step / {float(decay_steps):g})"
        return f"steps (stop at step {limit}): {lr}{warm}{at}{occ}"
    if schedule_steps is None:
        at = f"; grid stages at steps {stages}" if stages else ""
    else:
        fractions = [round(int(s) / float(schedule_steps), 4) for s in stages]
        at = f"; grid stages at steps {stages} or p >= {fractions}, whichever first" if stages else ""
    stop = "" if max_steps is None else f" or step {int(max_steps)}"
    start = float(decay_start or 0.0)
    lr = (f"lr x {float(decay):g} ** p" if start == 0 else
          f"lr constant until p = {start:g}, then x {float(decay):g} ** ((p - {start:g}) / {1 - start:g})")
    return (f"time budget (stop after {float(max_minutes):g} min of training{stop}; p = the fraction elapsed, "
            f"agreed across ranks): {lr}{warm}{at}{occ}")


def global_batch(train, world_size: int) -> int:
    """Rays per step over all ranks, the global batch of a ``train`` section at ``world_size`` ranks.

    ``train.global_rays`` when set (strong scaling: the batch is fixed and each rank trains ``global_rays /
    world_size``), else ``world_size x train.rays_per_rank`` (weak scaling, the default: each rank keeps its
    batch, :data:`~distnerf.schema.DEFAULT_RAYS_PER_RANK` when null). The loss is the mean over the global batch
    either way; the learning rate is not scaled with it (measured: bench/scaling/batches.md, "Batches that
    scale"). What "per rank" means under each strategy: :meth:`distnerf.strategy.base.Strategy.rays_per_rank`.

    Args:
        train: the validated ``train`` node, or a run directory's saved ``train`` mapping (one from before
            ``rays_per_rank`` existed always has ``global_rays``, read first).
        world_size: ranks of the run (>= 1).
    """
    if train["global_rays"] is not None:
        return int(train["global_rays"])
    per_rank = train["rays_per_rank"]
    return world_size * int(DEFAULT_RAYS_PER_RANK if per_rank is None else per_rank)


def describe_batch_rule(train) -> str:
    """Which of the two batch keys sets the batch, and how it follows the world size (the start-up log)."""
    if train["global_rays"] is not None:
        return f"fixed by train.global_rays={train['global_rays']}, divided over the ranks"
    per_rank = train["rays_per_rank"]
    return (f"train.rays_per_rank={DEFAULT_RAYS_PER_RANK if per_rank is None else per_rank}"
            f"{' (default)' if per_rank is None else ''} x the world size")


def _check_batch(train: DictConfig, prefix: str) -> None:
    """The two batch keys are alternatives (:func:`global_batch`): one may be set, not both."""
    if train.global_rays is not None and train.rays_per_rank is not None:
        raise ConfigError(f"config {prefix}global_rays={train.global_rays} and {prefix}rays_per_rank="
                          f"{train.rays_per_rank} are both set: give {prefix}rays_per_rank (per rank, the global "
                          f"batch grows with the world size) or {prefix}global_rays (a fixed global batch divided "
                          f"over the ranks), not both (where a preset sets one, e.g. experiment=smoke's "
                          f"global_rays, set it to null)")


def _schedule_resolver(*, _parent_, _root_) -> str:
    """``optim.schedule``: :func:`describe_schedule` of the ``optim`` node holding it and, when the root has
    them, the ``train`` section (the run's length) and the ``model`` beside it (an ``optim`` section alone:
    the steps rule of the default length)."""
    o = _parent_
    model = _root_.get("model") if _root_ is not _parent_ else None
    model = model if isinstance(model, DictConfig) else {}
    train = _root_.get("train") if _root_ is not _parent_ else None
    train = train if isinstance(train, DictConfig) else {}
    return describe_schedule(train.get("max_steps"), train.get("max_minutes"), o.get("decay"), o.get("decay_steps"),
                             o.get("warmup_steps"), o.get("schedule_steps"), model.get("upsample_steps"),
                             model.get("occupancy_every"), o.get("decay_start", 0.0))


OmegaConf.register_new_resolver("distnerf_schedule", _schedule_resolver, replace=True)


PREFIX = {SamplerConfig: "sampler.", TrainLoopConfig: "train.", EvalConfig: "eval.", ProfilerConfig: "profiler.",
          LoggerConfig: "logger.", TraceConfig: "profiler.trace.", ViewerConfig: "viewer.", OptimConfig: "optim.",
          StepConfig: "step.", CheckpointsConfig: "checkpoints.", MonitorConfig: "monitor."}
PREFIX.update({schema: f"{group}." for group, options in {
    "dataset": (SyntheticDataset, BlenderDataset, LLFFDataset, ColmapDataset, NerfstudioDataset),
    "model": (GridModelConfig, NeRFModelConfig, NGPModelConfig),
    "strategy": (DDPStrategyConfig, SSStrategyConfig)}.items() for schema in options})
GROUPS = {
    "dataset": {"synthetic": SyntheticDataset, "blender": BlenderDataset, "llff": LLFFDataset,
                "colmap": ColmapDataset, "nerfstudio": NerfstudioDataset},
    "model": {"grid": GridModelConfig, "nerf": NeRFModelConfig, "ngp": NGPModelConfig},
    "strategy": {"ddp": DDPStrategyConfig, "ss": SSStrategyConfig},
}


def register() -> None:
    """Register the schemas in Hydra's ConfigStore: ``schema_train`` (root) and
    ``<group>/schema_<option>`` (the base of each ``conf/<group>/<option>.yaml``)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="schema_train", node=TrainConfig)
    for group, options in GROUPS.items():
        for option, node in options.items():
            cs.store(group=group, name=f"schema_{option}", node=node)
    cs.store(group="sampler", name="schema", node=SamplerConfig)
    cs.store(group="profiler", name="schema", node=ProfilerConfig)
    cs.store(group="logger", name="schema", node=LoggerConfig)


def _schema_of(group: str, node) -> type:
    name = node.get("name") if isinstance(node, (dict, DictConfig)) else None
    options = GROUPS[group]
    if name not in options:
        raise ConfigError(f"config {group}.name={name!r} is not one of {sorted(options)}")
    return options[name]


def _omegaconf_reason(err: Exception) -> tuple[str | None, str]:
    """(the full key, when the first line does not name it; the first line) of an OmegaConf error."""
    first, key = str(err).splitlines()[0], getattr(err, "full_key", None)
    return (key if key and key not in first else None), first


def structured(cfg, root: type = TrainConfig) -> DictConfig:
    """``cfg`` (a composed or saved config) merged into the schemas: defaults filled in,
    types converted, unknown keys refused. ``root``: :class:`TrainConfig` or a subclass
    with further top-level keys (:class:`RenderConfig`).

    Raises:
        ValueError: an unknown group option, key or a value of the wrong type, naming it.
    """
    cfg = OmegaConf.create(cfg) if not isinstance(cfg, DictConfig) else cfg
    try:
        base = OmegaConf.structured(root)
        for group in GROUPS:
            OmegaConf.update(base, group, OmegaConf.structured(_schema_of(group, cfg.get(group))), merge=False)
        OmegaConf.set_struct(base, True)
        merged = OmegaConf.merge(base, cfg)
    except ConfigError:
        raise
    except Exception as err:
        key, first = _omegaconf_reason(err)
        raise ConfigError(f"config {key}: {first}" if key else f"config: {first}") from None
    return merged


def check(cfg: DictConfig, prefix: str = "") -> None:
    """Check every declared choice and bound of ``cfg`` (a config built by :func:`structured`).

    Raises:
        ValueError: ``config KEY=VALUE is not one of [...]`` / ``... must be >= LOW``.
    """
    schema = OmegaConf.get_type(cfg)
    if not dataclasses.is_dataclass(schema):
        return
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        value = cfg.get(f.name)
        if isinstance(value, DictConfig):
            check(value, key + ".")
            continue
        if value is None or OmegaConf.is_missing(cfg, f.name):
            if f.default is MISSING and OmegaConf.is_missing(cfg, f.name):
                raise ConfigError(f"config {key} is required (e.g. {key}=PATH)")
            continue
        meta = f.metadata
        if "choices" in meta and value not in meta["choices"]:
            raise ConfigError(f"config {key}={value!r} is not one of {list(meta['choices'])}")
        low, high = meta.get("low"), meta.get("high")
        if low is not None and (value <= low if meta.get("low_open") else value < low):
            raise ConfigError(f"config {key}={value!r} must be {'>' if meta.get('low_open') else '>='} {low}")
        if high is not None and value > high:
            raise ConfigError(f"config {key}={value!r} must be <= {high}")
    if schema is TrainLoopConfig:
        _check_batch(cfg, prefix)


def validate(cfg, root: type = TrainConfig) -> DictConfig:
    """:func:`structured` then :func:`check`: the config every entry point runs on."""
    merged = structured(cfg, root)
    check(merged)
    return merged


def typed(schema: type, cfg) -> DictConfig:
    """``cfg`` itself when it is a validated ``schema`` node (the run config's section, or one built by
    :func:`section`): what a builder that takes a typed node checks, so that it neither merges nor restates a
    default.

    Raises:
        TypeError: anything else (a dict, None, a partial mapping), naming the section expected.
    """
    if isinstance(cfg, DictConfig) and OmegaConf.get_type(cfg) is schema:
        return cfg
    name = PREFIX.get(schema, schema.__name__).rstrip(".")
    raise TypeError(f"expected the validated {name} section (a {schema.__name__} node: the run config's "
                    f"cfg.{name}, or config_check.section({schema.__name__}, ...)), not {type(cfg).__name__}")


def section(schema: type | str, cfg=None, **overrides) -> DictConfig:
    """One group's config, validated: ``cfg`` (a mapping, possibly partial, or None) and
    ``overrides`` merged into ``schema`` (a dataclass, or a group name of :data:`GROUPS`
    whose option is ``cfg['name']``) and checked. Components build their settings with it,
    so a partial mapping (a test, a tool) gets the schema's defaults, never a restated one.
    A node of the validated run config (its type already ``schema``, or the group's option)
    is returned as it is, or with ``overrides`` through :func:`derive`: the config is validated
    once, at the entry point, and passed down.

    Raises:
        ValueError: as :func:`structured` and :func:`check`, keys named relative to the group.
    """
    if isinstance(cfg, DictConfig) and OmegaConf.get_type(cfg) is (
            _schema_of(schema, cfg) if isinstance(schema, str) else schema):
        # already validated (the composed config's own node, passed down typed)
        return derive(cfg, **overrides) if overrides else cfg
    data = OmegaConf.merge(OmegaConf.create(cfg if cfg is not None else {}), overrides) if overrides else cfg
    data = data if data is not None else {}
    prefix = f"{schema}." if isinstance(schema, str) else PREFIX.get(schema, "")
    if isinstance(schema, str):
        schema = _schema_of(schema, data)
    merged = _merge_section(schema, data, prefix)
    check(merged, prefix)
    return merged


def _merge_section(schema: type, data, prefix: str) -> DictConfig:
    """``data`` merged into a fresh ``schema`` node (struct mode): :func:`section`'s one merge."""
    try:
        node = OmegaConf.structured(schema)
        OmegaConf.set_struct(node, True)
        return OmegaConf.merge(node, data)
    except Exception as err:
        key, first = _omegaconf_reason(err)
        first = f"{key}: {first}" if key else first
        raise ConfigError(f"config {prefix.rstrip('.') or schema.__name__}: {first} (keys and defaults: "
                         f"distnerf/schema.py::{schema.__name__})") from None


def derive(cfg: DictConfig, **overrides) -> DictConfig:
    """A copy of ``cfg``, a validated node (the run config, or a group of it such as ``cfg.model``),
    with ``overrides`` set: a sub-configuration without a merge into the schema again. Each value
    is converted and type-checked by OmegaConf on assignment (the node keeps its schema type),
    then the copy's choices and bounds are checked (:func:`check`). ``cfg`` is left unchanged.

    Example: ``derive(cfg.model, max_params=cfg.model.max_params // 2)``.

    Raises:
        TypeError: ``cfg`` is not a validated node (run it through :func:`validate` or :func:`section`).
        ValueError: an unknown key, a value of the wrong type or out of bounds (naming it).
    """
    schema = OmegaConf.get_type(cfg) if isinstance(cfg, DictConfig) else None
    if schema is None or not dataclasses.is_dataclass(schema):
        raise TypeError(f"derive() takes a validated config node (config_check.validate / section), not "
                        f"{type(cfg).__name__} of {schema}")
    prefix = PREFIX.get(schema, "")
    out = copy.deepcopy(cfg)  # keeps its parent: interpolations still resolve against the run config
    for key, value in overrides.items():
        try:
            out[key] = value  # struct mode refuses an unknown key; the field's type converts or refuses the value
        except Exception as err:
            raise ConfigError(f"config {prefix}{key}={value!r}: {_omegaconf_reason(err)[1]} (keys and "
                              f"defaults: distnerf/schema.py::{schema.__name__})") from None
    check(out, prefix)
    return out


register()  # importing this module makes the schemas composable (Hydra's compose API, tests, tools)
