"""A study's cells: the declared axes expanded into training runs.

A study config (``conf/study/*.yaml``, schema :class:`distnerf.schema.StudyConfig`) names the
values of each axis; a **cell** is one combination, repeated ``repeats`` times. Its
training overrides are the study's ``fixed`` ones, then each axis value's ``levels``
entry, in the order of :data:`AXES`. The built-in levels:

* ``strategy``: ``ddp``; ``ss_independent`` (Mega-NeRF style) and ``ss_joint`` (NeRF-XL
  style exact compositing), i.e. ``strategy=ss strategy.training=...``;
* ``sampler``: ``sync``, ``pipelined``, ``device`` (``sampler=<it>``);
* ``world_size``: an integer, the ranks of the cell (torchrun ``--nproc_per_node``); a
  config's ``levels.world_size.<W>`` may add overrides (e.g. ``train.global_rays=2048`` at every W for
  strong scaling; equal rays per rank per step is the default, ``train.rays_per_rank``, and needs none);
* ``model``: ``grid``, ``ngp``, ``nerf`` (``model=<it>``).

``scene`` and ``budget`` have no built-in meaning: the config's ``levels`` gives them
(e.g. ``budget: {s300: [train.max_steps=300]}``), and may override a built-in level.

Cell ids are the axis values joined in :data:`AXES` order (``ddp-sync-w2-lego-grid-s300``),
then ``-r<repeat>``; run order interleaves repeats (every cell's ``r0``, then every
``r1``, ...), so a slow drift of the machine spreads over all cells alike. Repeat ``r``
trains with ``seed=<study seed + r>`` (``vary_seed``, the default): new ray streams (which rays
each step draws) and new sample jitter, so the quality of a cell's repeats is a sample with a
spread, where one seed gives n copies of one figure (the timing spread alone). The initialisation
does not vary with the default model (``model=grid``, ``model.color=sh``: the tables start at zero,
the colour head has no parameters); it varies too only where the model draws it (``model.color=mlp``,
``model=nerf``, ``model=ngp``). A cell that logs to W&B does so in the
group ``study-<name>``, job type its strategy, run name its id: W&B's grouping and parallel
coordinates compare the cells of a study directly.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from omegaconf import OmegaConf

from ..config_check import ConfigError, section
from ..observe.compare import ignored
from ..schema import StudyConfig

AXES = ("strategy", "sampler", "world_size", "scene", "model", "budget")
BUILTIN_LEVELS = {
    "strategy": {"ddp": ["strategy=ddp"],
                 "ss_independent": ["strategy=ss", "strategy.training=independent"],
                 "ss_joint": ["strategy=ss", "strategy.training=joint"]},
    "sampler": {name: [f"sampler={name}"] for name in ("sync", "pipelined", "device")},
    "model": {name: [f"model={name}"] for name in ("grid", "ngp", "nerf")},
}
_ID_SAFE = re.compile(r"^[A-Za-z0-9_.]+$")


@dataclasses.dataclass(frozen=True)
class Cell:
    """One training run of the study.

    Attributes:
        id: ``<axis values>-r<repeat>``, the run directory's name under ``STUDY_DIR/cells/``.
        key: the id without the repeat (repeats of one cell share it).
        values: {axis: value} for every axis of :data:`AXES` (``None``: the axis is not declared).
        repeat: 0-based repeat index.
        world_size: ranks of the run.
        overrides: Hydra overrides of ``distnerf.train`` (fixed, then the axes' levels).
        timed: whether the cell waits for a quiet machine first (the study's ``timed``).
    """
    id: str
    key: str
    values: dict
    repeat: int
    world_size: int
    overrides: tuple
    timed: bool


def load_study(path: str | Path) -> "OmegaConf":
    """Read and validate a study config.

    Raises:
        FileNotFoundError: no such file. ConfigError: a key, axis or level is wrong (named).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"study config {path} not found (the shipped ones: conf/study/*.yaml)")
    try:
        cfg = section(StudyConfig, OmegaConf.load(path))
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    check_study(cfg, str(path))
    return cfg


def levels_of(cfg) -> dict:
    """{axis: {value: [overrides]}}: the built-in levels with the config's ``levels`` over them."""
    out = {axis: dict(v) for axis, v in BUILTIN_LEVELS.items()}
    for axis, table in (OmegaConf.to_container(cfg.levels) if cfg.levels is not None else {}).items():
        out.setdefault(axis, {}).update({str(k): list(v) for k, v in table.items()})
    return out


def check_study(cfg, where: str = "study") -> None:
    """Refuse unknown axes, values without a level, bad world sizes and selections naming nothing."""
    axes = OmegaConf.to_container(cfg.axes) if cfg.axes is not None else {}
    if not axes:
        raise ConfigError(f"{where}: axes is empty (give at least one of {list(AXES)})")
    unknown = sorted(set(axes) - set(AXES))
    if unknown:
        raise ConfigError(f"{where}: unknown axis {unknown}; the axes are {list(AXES)}")
    levels = levels_of(cfg)
    for axis, values in axes.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: axes.{axis} must be a non-empty list, got {values!r}")
        for v in values:
            if not _ID_SAFE.match(str(v)):
                raise ConfigError(f"{where}: axes.{axis} value {v!r} may hold only letters, digits, '_' and '.'")
            if axis == "world_size":
                if not isinstance(v, int) or v < 1:
                    raise ConfigError(f"{where}: axes.world_size values are rank counts >= 1, got {v!r}")
            elif str(v) not in levels.get(axis, {}):
                raise ConfigError(f"{where}: axes.{axis} value {v!r} has no level: add levels.{axis}.{v}: "
                                  f"[overrides] (built in: {sorted(levels.get(axis, {}))})")
    for name in ("cells", "exclude"):
        for sel in (OmegaConf.to_container(cfg[name]) if cfg[name] is not None else []):
            bad = {a: v for a, v in (sel or {}).items() if a not in axes or v not in axes[a]}
            if not isinstance(sel, dict) or not sel or bad:
                raise ConfigError(f"{where}: {name} entry {sel!r} names no declared axis value {bad or ''}")


def _matches(values: dict, selection: dict) -> bool:
    return all(values.get(a) == v for a, v in selection.items())


def cell_key(values: dict) -> str:
    parts = []
    for axis in AXES:
        v = values.get(axis)
        if v is not None:
            parts.append(f"w{v}" if axis == "world_size" else str(v))
    return "-".join(parts)


def expand(cfg) -> list[Cell]:
    """The study's cells in run order (repeats interleaved).

    Returns:
        a list of :class:`Cell`, ``len = selected combinations x repeats``.
    Raises:
        ConfigError: the selection leaves no cell.
    """
    axes = OmegaConf.to_container(cfg.axes)
    levels = levels_of(cfg)
    combos = [{}]
    for axis in AXES:
        if axis in axes:
            combos = [{**c, axis: v} for c in combos for v in axes[axis]]
    wanted = OmegaConf.to_container(cfg.cells) if cfg.cells is not None else None
    if wanted is not None:
        combos = [c for c in combos if any(_matches(c, sel) for sel in wanted)]
    excluded = OmegaConf.to_container(cfg.exclude) or []
    combos = [c for c in combos if not any(_matches(c, sel) for sel in excluded)]
    if not combos:
        raise ConfigError(f"study {cfg.name}: the cells/exclude selection leaves no cell")
    fixed = list(cfg.fixed)
    cells = []
    for repeat in range(cfg.repeats):
        for values in combos:
            overrides = list(fixed)
            for axis in AXES:
                if axis in values:  # world size: overrides only where the config gives them
                    overrides += levels.get(axis, {}).get(str(values[axis]), []) if axis == "world_size" \
                        else levels[axis][str(values[axis])]
            key = cell_key(values)
            # the repeat's seed: other ray streams and jitter per repeat (vary_seed; the default grid's
            # initialisation is the same for every seed), or one seed
            overrides.append(f"seed={int(cfg.seed) + (repeat if cfg.vary_seed else 0)}")
            # W&B (when a cell logs there): one group per study, the strategy as job type, the cell as the run
            overrides += [f"logger.wandb.group=study-{cfg.name}", f"logger.wandb.job_type={values.get('strategy', 'train')}",
                          f"logger.wandb.name={key}-r{repeat}"]
            cells.append(Cell(id=f"{key}-r{repeat}", key=key, values={a: values.get(a) for a in AXES},
                              repeat=repeat, world_size=int(values.get("world_size", 1)),
                              overrides=tuple(overrides), timed=bool(cfg.timed)))
    return cells


THREAD_KEYS = ("env.torch_threads", "env.torch_interop_threads", "env.omp_num_threads")
"""Environment keys that follow the world size when the study leaves ``threads`` unset (the runner
gives each rank ``cpu_count // world_size`` threads: :func:`distnerf.study.runner.threads_per_rank`)."""
_BOOKKEEPING = ("logger.wandb.job_type", "logger.wandb.name")  # each cell's W&B run


def _override_key(override: str) -> str:
    """The config key (or group) a Hydra override sets: ``+a.b=1`` -> ``a.b``, ``g@pkg=x`` -> ``g``."""
    return override.lstrip("+~").split("=", 1)[0].split("@", 1)[0]


def _level_keys(levels: dict, axis: str, value) -> set[str]:
    return {_override_key(ov) for ov in levels.get(axis, {}).get(str(value), [])}


def declared_keys(cfg) -> list[str]:
    """Config keys (and ``env.`` keys) the study varies on purpose: every key a level sets
    (``strategy=ss`` declares the whole ``strategy`` group), and ``env.world_size`` when
    world size is an axis. Which of them two given cells may differ in: :func:`declared_between`."""
    axes = OmegaConf.to_container(cfg.axes)
    levels = levels_of(cfg)
    keys = set(_BOOKKEEPING)
    for axis, values in axes.items():
        if axis == "world_size":
            keys.add("env.world_size")
        for v in values:
            keys |= _level_keys(levels, axis, v)
    if cfg.vary_seed and cfg.repeats > 1:
        keys.add("seed")  # the repeats' seeds
    return sorted(keys)


def declared_between(cfg, a: dict, b: dict) -> list[str]:
    """The keys two cells may differ in on purpose: those the levels of the axes on which the two
    differ set (both cells' levels), ``env.world_size`` and, when ``cfg.threads`` is unset,
    :data:`THREAD_KEYS` where their world sizes differ, and ``seed`` where their repeats differ
    (``vary_seed``). A setting of an axis on which the two agree is not declared between them: two
    cells of one scene whose ``dataset.resolution`` differs differ in an undeclared setting, although
    the scene's level (``dataset=synthetic``) declares the ``dataset`` group across scenes.

    Args:
        a, b: ``{"values": {axis: value}, "repeat": int}`` (a :class:`Cell` as a dict, or the
            report's cell row).
    """
    levels = levels_of(cfg)
    keys = set(_BOOKKEEPING)
    for axis in AXES:
        va, vb = a["values"].get(axis), b["values"].get(axis)
        if va == vb:
            continue
        keys |= _level_keys(levels, axis, va) | _level_keys(levels, axis, vb)
        if axis == "world_size":
            keys.add("env.world_size")
            if cfg.threads is None:
                keys.update(THREAD_KEYS)
    if cfg.vary_seed and a["repeat"] != b["repeat"]:
        keys.add("seed")
    return sorted(keys)


def override_settings(overrides) -> dict:
    """``{key: value}`` of Hydra overrides as written (``+key`` as ``key``; ``~key`` as the value
    ``"<deleted>"``; ``group@package`` kept whole), the last override of a key winning, as in Hydra."""
    out = {}
    for ov in overrides:
        key, _, value = ov.partition("=")
        out[key.lstrip("+~")] = "<deleted>" if key.startswith("~") else value
    return out


def override_changes(before, now) -> dict:
    """``{key: [value before, value now]}`` (``None``: not set) where two override lists set a key
    differently; keys that never change what a run measures (:func:`distnerf.observe.compare.ignored`:
    the W&B run's names, ``run_dir``, ``monitor.progress``, ...) are left out."""
    a, b = override_settings(before), override_settings(now)
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k) and not ignored(k)}
