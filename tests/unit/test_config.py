"""Config schemas (distnerf/schema.py) against the YAML groups in conf/: every option with
every experiment overlay composes and validates; errors name the key, the value and what
is allowed; each default is written once (the YAML group files hold only what an option changes)."""
from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from distnerf import config_check, schema

CONF = Path(__file__).resolve().parents[2] / "conf"
GROUPS = ("dataset", "model", "strategy", "sampler", "logger", "profiler")


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_train(overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=overrides)


def test_every_group_file_has_a_schema():
    for group in GROUPS:
        assert options(group), group
    assert set(options("model")) == set(config_check.GROUPS["model"])
    assert set(options("dataset")) == set(config_check.GROUPS["dataset"])
    assert set(options("strategy")) == set(config_check.GROUPS["strategy"])


@pytest.mark.parametrize("experiment", [None] + options("experiment"))
def test_every_option_composes_with_every_experiment(experiment):
    """Each option of each group (the others at their defaults), and each model x strategy
    pair, with the overlay: composes, validates, and the option is what runs."""
    runs = [[f"{g}={o}"] for g in GROUPS for o in options(g)]
    runs += [[f"model={m}", f"strategy={s}"] for m, s in itertools.product(options("model"), options("strategy"))]
    for overrides in runs:
        extra = ["dataset.root=/data/x"] if any(o.startswith("dataset=") and o != "dataset=synthetic"
                                                for o in overrides) else []
        cfg = config_check.validate(compose_train(overrides + extra + ([f"experiment={experiment}"] if experiment else [])))
        for o in overrides:
            group, option = o.split("=")
            if group in config_check.GROUPS:
                assert cfg[group].name == option, o
                assert OmegaConf.get_type(cfg[group]) is config_check.GROUPS[group][option]


def test_smoke_overlay_sets_each_models_own_small_sizes():
    grid = config_check.validate(compose_train(["experiment=smoke"]))
    ngp = config_check.validate(compose_train(["experiment=smoke", "model=ngp"]))
    assert list(grid.model.resolutions) != list(schema.GridModelConfig().resolutions)
    assert ngp.model.log2_table_size < schema.NGPModelConfig().log2_table_size
    assert grid.train.max_steps == ngp.train.max_steps == yaml.safe_load((CONF / "experiment/smoke.yaml").read_text())[
        "train"]["max_steps"]


def test_defaults_are_written_once_in_the_schema():
    """The group files set only ``defaults`` and what differs from the option's schema."""
    for group in GROUPS:
        for option in options(group):
            data = yaml.safe_load((CONF / group / f"{option}.yaml").read_text()) or {}
            node = config_check.GROUPS.get(group, {}).get(option) or {
                "sampler": schema.SamplerConfig, "logger": schema.LoggerConfig,
                "profiler": schema.ProfilerConfig}[group]
            defaults = {f.name: OmegaConf.to_container(OmegaConf.structured(node))[f.name]
                        for f in dataclasses.fields(node)}
            for key, value in data.items():
                if key == "defaults":
                    continue
                assert key in defaults, f"{group}/{option}.yaml: {key} is not a key of {node.__name__}"
                assert value != defaults[key], f"{group}/{option}.yaml restates the default {key}={value!r}"


@pytest.mark.parametrize("override, message", [
    ("strategy.compression=fp61", r"config strategy.compression='fp61' is not one of \['none', 'fp16', 'bf16'\]"),
    ("model.color=rgb", r"config model.color='rgb' is not one of \['sh', 'mlp'\]"),
    ("train.max_steps=0", r"config train.max_steps=0 must be > 0"),
    ("checkpoints.every=-2", r"config checkpoints.every=-2 must be >= -1"),
    ("model.termination=2", r"config model.termination=2.0 must be <= 1"),
    # a list that grows with the code is read from the schema (adding a policy must not break this test)
    ("sampler.policy=random", r"config sampler.policy='random' is not one of "
                              + re.escape(str(list(config_check.choices_of(schema.SamplerConfig, "policy"))))),
    ("device=tpu", r"config device='tpu' is not one of \['auto', 'cpu', 'cuda'\]"),
])
def test_bad_values_name_key_value_and_allowed(override, message):
    with pytest.raises(ValueError, match=message):
        config_check.validate(compose_train([override]))


def test_missing_root_and_unknown_keys_are_named():
    with pytest.raises(ValueError, match=r"config dataset.root is required"):
        config_check.validate(compose_train(["dataset=llff"]))
    with pytest.raises(ValueError, match=r"config model: Key 'colr' not in 'GridModelConfig'"):
        config_check.section("model", {"name": "grid", "colr": "sh"})
    with pytest.raises(ValueError, match=r"config model.name='siren' is not one of \['grid', 'nerf', 'ngp'\]"):
        config_check.validate({"dataset": {"name": "synthetic"}, "model": {"name": "siren"}, "strategy": {"name": "ddp"}})
    with pytest.raises(Exception, match="model.colr"):  # Hydra refuses an unknown override at composition
        compose_train(["model.colr=sh"])


def test_saved_config_round_trips_and_partial_sections_get_the_schema_defaults(tmp_path):
    cfg = config_check.validate(compose_train(["model=ngp", "strategy=ss", "strategy.num_regions=4"]))
    path = tmp_path / "config.yaml"
    path.write_text(OmegaConf.to_yaml(cfg, resolve=True))  # what a run directory holds
    again = config_check.validate(OmegaConf.load(path), schema.RenderConfig)
    assert OmegaConf.to_container(again)["model"] == OmegaConf.to_container(cfg)["model"]
    assert again.strategy.num_regions == 4 and again.fusion is None
    part = config_check.section(schema.SamplerConfig, {"name": "sync"})
    assert part.num_workers == schema.SamplerConfig().num_workers and part.name == "sync"


def test_global_batch_per_rank_by_default_or_fixed_by_global_rays():
    """``train.rays_per_rank`` (the default, 4096): the global batch is W times it and each ``ddp``
    rank draws it; ``train.global_rays``: the batch is fixed and split over the W ranks."""
    from distnerf.distributed.env import DistEnv
    from distnerf.strategy import build_strategy

    cases = [([], 4096, None), (["train.rays_per_rank=1024"], 1024, None), (["train.global_rays=8192"], None, 8192)]
    for overrides, per_rank_key, fixed in cases:
        cfg = config_check.validate(compose_train(overrides))
        for world_size in (1, 2, 4):
            batch = fixed if fixed else world_size * per_rank_key
            per_rank = fixed // world_size if fixed else per_rank_key
            assert config_check.global_batch(cfg.train, world_size) == batch, (overrides, world_size)
            for rank in range(world_size):
                ddp = build_strategy(cfg.strategy, DistEnv(rank=rank, world_size=world_size))
                assert ddp.rays_per_rank(batch) == per_rank, (overrides, world_size, rank)


def test_both_batch_keys_set_is_refused_naming_both():
    with pytest.raises(config_check.ConfigError, match=re.escape(
            "config train.global_rays=8192 and train.rays_per_rank=1024 are both set: give train.rays_per_rank")):
        config_check.validate(compose_train(["train.global_rays=8192", "train.rays_per_rank=1024"]))
    # a preset's global_rays (experiment=smoke) with a per-rank batch on the command line: the same error ...
    with pytest.raises(config_check.ConfigError, match="are both set"):
        config_check.validate(compose_train(["experiment=smoke", "train.rays_per_rank=256"]))
    # ... and the preset's key set to null gives the per-rank batch
    cfg = config_check.validate(compose_train(["experiment=smoke", "train.global_rays=null", "train.rays_per_rank=256"]))
    assert config_check.global_batch(cfg.train, 2) == 512


def test_a_saved_config_from_before_rays_per_rank_means_the_same(tmp_path):
    """A run directory's config.yaml written before ``train.rays_per_rank`` existed (``global_rays:
    4096``, no ``rays_per_rank``) validates and keeps its fixed global batch at any world size, read
    as the validated node (resume, render) or as a plain mapping (the study collector)."""
    cfg = config_check.validate(compose_train([]))
    old = OmegaConf.to_container(cfg, resolve=True)
    del old["train"]["rays_per_rank"]
    old["train"]["global_rays"] = 4096
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(old))
    again = config_check.validate(OmegaConf.load(path))
    assert again.train.global_rays == 4096 and again.train.rays_per_rank is None
    plain = yaml.safe_load(path.read_text())["train"]
    for world_size in (1, 2, 4):
        assert config_check.global_batch(again.train, world_size) == 4096
        assert config_check.global_batch(plain, world_size) == 4096
    # and one written now (both keys null) reads back as the per-rank default
    path.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    assert config_check.global_batch(config_check.validate(OmegaConf.load(path)).train, 4) == 4 * 4096


def test_the_code_restates_no_config_default():
    """No ``cfg.get("key", default)`` on a config key anywhere in the package: the code reads
    the validated config, whose defaults are the schema's."""
    import ast

    keys = {f.name for node in [schema.TrainConfig, schema.TrainLoopConfig, schema.EvalConfig, schema.SamplerConfig,
                                schema.ProfilerConfig, schema.TraceConfig, schema.LoggerConfig, schema.WandbConfig,
                                *(n for options in config_check.GROUPS.values() for n in options.values())]
            for f in dataclasses.fields(node)}
    found = []
    for path in sorted((CONF.parent / "distnerf").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for call in ast.walk(tree):
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "get"
                    and len(call.args) == 2 and isinstance(call.args[0], ast.Constant) and call.args[0].value in keys
                    and "cfg" in ast.unparse(call.func.value)):
                found.append(f"{path.relative_to(CONF.parent)}:{call.lineno}: {ast.unparse(call)}")
    assert not found, "\n".join(found)


def test_a_datasets_model_settings_apply_under_that_dataset_only():
    """conf/dataset_model/<dataset>_<model>.yaml: lego's grid gets its finer final stage; the built-in scene keeps
    the schema's, an experiment's overlay and the command line still win."""
    blender_grid = yaml.safe_load((CONF / "dataset_model/blender_grid.yaml").read_text())["resolutions"]
    assert blender_grid != list(schema.GridModelConfig().resolutions)
    lego = config_check.validate(compose_train(["dataset=blender", "dataset.root=/data/x"]))
    assert list(lego.model.resolutions) == blender_grid
    assert list(config_check.validate(compose_train([])).model.resolutions) == list(schema.GridModelConfig().resolutions)
    smoke = config_check.validate(compose_train(["dataset=blender", "dataset.root=/data/x", "experiment=smoke"]))
    assert list(smoke.model.resolutions) == yaml.safe_load((CONF / "experiment_model/smoke_grid.yaml").read_text())[
        "resolutions"]
    given = config_check.validate(compose_train(["dataset=blender", "dataset.root=/data/x", "model.resolutions=[32,64]"]))
    assert list(given.model.resolutions) == [32, 64]
    ngp = config_check.validate(compose_train(["dataset=blender", "dataset.root=/data/x", "model=ngp"]))
    assert "resolutions" not in ngp.model


def test_derive_sets_keys_on_a_typed_copy_and_checks_them():
    """``derive``: a validated node with some keys changed, the node's schema type kept, the
    original untouched; an unknown key, a wrong type or a bound is refused, naming the key."""
    cfg = config_check.validate(compose_train(["experiment=smoke"]))
    model = config_check.derive(cfg.model, max_params=1234, resolutions=[4, 8])
    assert OmegaConf.get_type(model) is schema.GridModelConfig
    assert model.max_params == 1234 and list(model.resolutions) == [4, 8]
    assert cfg.model.max_params is None and list(cfg.model.resolutions) != [4, 8]
    assert model.step_ratio == cfg.model.step_ratio  # the keys not given are the node's own
    assert config_check.derive(cfg.model, max_params="12").max_params == 12  # converted as a merge would
    with pytest.raises(ValueError, match=r"config model.colr=.*not in 'GridModelConfig'"):
        config_check.derive(cfg.model, colr="sh")
    with pytest.raises(ValueError, match=r"config model.max_params='many'"):
        config_check.derive(cfg.model, max_params="many")
    with pytest.raises(ValueError, match=r"config model.tv_weight=-1.0 must be >= 0"):
        config_check.derive(cfg.model, tv_weight=-1.0)
    with pytest.raises(TypeError, match="validated config node"):
        config_check.derive({"name": "grid"}, max_params=1)


def test_a_training_run_validates_its_config_once_and_derives_the_rest(tmp_path, synthetic_cache, monkeypatch):
    """One in-process run of ``distnerf.train.run`` (2 steps; joint ``ss`` with a parameter budget
    and a TV weight: the strategy, the per-region budget and TV share and the budget's probe all
    derive configs from the run's): one whole-config merge into the schemas (``validate``), no
    group merged into its schema again (``section`` on a node of the run config passes it through)."""
    import logging

    from distnerf import train
    from distnerf.observe.logger import final_model_size, read_metrics_log

    calls = {"validate": 0, "section_merge": 0}

    def spy(name, real):
        def counted(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return counted

    monkeypatch.setattr(config_check, "structured", spy("validate", config_check.structured))
    monkeypatch.setattr(config_check, "_merge_section", spy("section_merge", config_check._merge_section))
    cfg = compose_train(["experiment=smoke", "sampler=sync", "strategy=ss", "strategy.num_regions=2",
                         "strategy.training=joint", "strategy.context_resolution=8", "model.max_params=100000",
                         "model.tv_weight=0.001", "train.max_steps=2", "checkpoints.every=-1", "monitor.progress=false",
                         "eval.enabled=false", "profiler.telemetry=false", f"dataset.cache_dir={synthetic_cache}",
                         f"run_dir={tmp_path / 'run'}"])
    logger = logging.getLogger("distnerf")  # run() installs its handlers: restored for the tests after this one
    saved = (list(logger.handlers), logger.propagate, logger.level)
    try:
        result = train.run(cfg)
    finally:
        for handler in logger.handlers:
            if handler not in saved[0]:
                handler.close()
        logger.handlers[:], logger.propagate, logger.level = saved
    assert result["step"] == 2
    assert calls["validate"] == 1, calls
    assert calls["section_merge"] == 0, calls
    size = final_model_size(read_metrics_log(tmp_path / "run"))  # what the derived configs built
    # joint ss shards one model of the rank's budget (strategy.joint_model=auto: sharded): each region its share
    budgets = [r["budget"] for r in size["parameters_per_region"].values()]
    assert [b["max_params"] for b in budgets] == [50000, 50000]
    whole = budgets[0]["whole_model_parameters"]
    assert all(b["whole_model_max_params"] == 100000 >= b["whole_model_parameters"] == whole for b in budgets)
    # the shards hold the whole model's tables once, but for a duplicated face plane (its appearance: apart)
    assert whole * 0.95 < sum(b["final_parameters"] for b in budgets) < whole * 1.15


# ----------------------------------------------------------------------------- sections by concern
OLD_LAYOUT = CONF.parent / "tests" / "fixtures" / "config_before_sections.yaml"


def test_train_holds_the_batch_and_the_run_s_length_only():
    """The issue's target: ``train`` at most 10 keys; every other step setting in its own section."""
    assert [f.name for f in dataclasses.fields(schema.TrainLoopConfig)] == [
        "rays_per_rank", "global_rays", "max_steps", "max_minutes"]
    sections = {"optim": schema.OptimConfig, "step": schema.StepConfig, "checkpoints": schema.CheckpointsConfig,
                "monitor": schema.MonitorConfig}
    for new in config_check.MOVED_TRAIN_KEYS.values():  # every moved key has a field where the map says
        group, key = new.split(".")
        assert key in {f.name for f in dataclasses.fields(sections[group])}, new


def test_a_run_directory_from_before_the_sections_loads_with_its_values_moved(tmp_path):
    """A config.yaml the old code wrote (the fixture: every old train key, four of them off their defaults) is
    read by render, export and view (load_run_config): every old key lands in its section with its value."""
    from distnerf.engine.runs import load_run_config

    old = yaml.safe_load(OLD_LAYOUT.read_text())
    assert {"lr", "ckpt_every", "graph_probe_every", "ckpt_async", "log_every"} <= set(old["train"])
    (tmp_path / "config.yaml").write_text(OLD_LAYOUT.read_text())
    cfg, _ = load_run_config([f"run_dir={tmp_path}", "eval.num_views=1"])
    assert list(cfg.train) == ["rays_per_rank", "global_rays", "max_steps", "max_minutes"]
    assert (cfg.train.global_rays, cfg.train.max_steps) == (512, 20)
    assert cfg.optim.lr == 0.02 and cfg.checkpoints.every == 7 and cfg.step.probe_every == 9
    assert cfg.checkpoints.background is False and cfg.monitor.log_every == 5 and cfg.eval.num_views == 1
    assert cfg.optim.schedule == old["train"]["schedule"]  # the saved (resolved) rule, kept
    # the converter alone: every old key moved, nothing else touched; a config in the new layout unchanged
    new = config_check.upgrade_config(old)
    assert OmegaConf.to_container(new.train) == {k: old["train"][k] for k in cfg.train}
    assert config_check.upgrade_config(new) == new


def test_an_old_train_key_is_refused_naming_its_new_key():
    """A user types train.lr=... (the old layout): an error naming optim.lr, not Hydra's 'not in TrainLoopConfig'."""
    with pytest.raises(config_check.ConfigError, match=r"train\.lr moved to optim\.lr.*optim\.lr=0\.1"):
        config_check.refuse_moved_keys(["model=grid", "train.lr=0.1"])
    with pytest.raises(config_check.ConfigError, match=r"train\.ckpt_async moved to checkpoints\.background"):
        config_check.refuse_moved_keys(["+train.ckpt_async=false"])
    config_check.refuse_moved_keys(["train.max_steps=3", "optim.lr=0.1", "eval.lr=1"])  # keys that did not move
    # a study cell recorded before the split ran with the settings its plan names now
    assert config_check.upgrade_overrides(["train.lr=1", "+train.ckpt_every=3", "train.max_steps=5", "seed=2"]) == [
        "optim.lr=1", "+checkpoints.every=3", "train.max_steps=5", "seed=2"]


def test_a_builder_of_the_step_takes_typed_sections_only():
    """The schedule, the optimizer, the step and the checkpointer take the validated sections (typed nodes): a dict
    or None is refused naming the section, never merged with the schema's defaults a second time."""
    from distnerf.components.optim import build_optimizer
    from distnerf.components.schedule import lr_factor, step_limit

    optim = config_check.section(schema.OptimConfig, decay_steps=10.0)
    train = config_check.section(schema.TrainLoopConfig)
    assert lr_factor(10, optim, train) == pytest.approx(0.1) and step_limit(train) == schema.DEFAULT_MAX_STEPS
    with pytest.raises(TypeError, match=r"the validated optim section .*OptimConfig.* not dict"):
        lr_factor(10, {"decay_steps": 10.0}, train)
    with pytest.raises(TypeError, match=r"the validated train section .* not NoneType"):
        step_limit(None)
    with pytest.raises(TypeError, match=r"the validated optim section"):
        build_optimizer(None, config_check.section(schema.StepConfig))  # a typed node of another section
