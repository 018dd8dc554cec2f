"""A/B comparison of two profiled runs: ``python -m distnerf.profile compare RUN_A RUN_B --vary KEY``.

Side by side: the median of every phase and its ratio B/A, global rays/s, test PSNR,
and start-up (the summary's skipped leading steps, compilation included) apart from
the steady state. The comparison is refused when the runs differ in a setting that
is not declared as the A/B variable: any key of ``config.yaml`` (except bookkeeping
such as ``run_dir``) or of the environment fingerprint ``profile/env.json``
(processor, accelerator, thread counts, torch/CUDA/NCCL versions, world size).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from ..config_check import upgrade_config
from .breakdown import PHASES
from .run_report import build_report

# keys that never change what is measured (bookkeeping, output locations, console; optim.schedule is a
# description derived from keys compared on their own)
IGNORED = ("run_dir", "resume", "monitor.progress", "logger.", "dataset.cache_dir", "optim.schedule")
ABSENT = "<absent>"


def ignored(key: str) -> bool:
    """Whether a flattened config key is one of :data:`IGNORED` (or under one ending in ``.``)."""
    return any(key == i or (i.endswith(".") and key.startswith(i)) for i in IGNORED)


class UndeclaredDifference(ValueError):
    """The two runs differ in settings not named as the A/B variable."""


def flatten(tree, prefix: str = "") -> dict:
    """``{"a.b.c": value}`` of a nested dict (lists kept as values)."""
    out = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


def load_settings(run_dir: Path) -> dict:
    """Flattened ``config.yaml`` plus ``env.<key>`` of ``profile/env.json``.

    Raises:
        FileNotFoundError: a file is missing (names it).
    """
    run_dir = Path(run_dir)
    cfg_path, env_path = run_dir / "config.yaml", run_dir / "profile" / "env.json"
    for p in (cfg_path, env_path):
        if not p.exists():
            raise FileNotFoundError(f"{p}: missing (compare needs a distnerf run directory with profiling)")
    # a run from before the train section's split by concern: its keys under their new names
    settings = flatten(OmegaConf.to_container(upgrade_config(yaml.safe_load(cfg_path.read_text()) or {})))
    settings.update({f"env.{k}": v for k, v in json.loads(env_path.read_text()).items()})
    return settings


def _declared(key: str, vary: list[str]) -> bool:
    return any(key == v or key.startswith(v.rstrip(".") + ".") for v in vary)


def schema_default(key: str, settings: dict):
    """The schema's default (:mod:`distnerf.schema`) of a flattened config key, for the option
    ``settings`` names in its group (``model.name`` for ``model.min_altitude``); :data:`ABSENT`
    when the schema declares no such key."""
    from ..config_check import GROUPS, PREFIX

    group = key.split(".", 1)[0]
    if group in GROUPS:
        schema = GROUPS[group].get(settings.get(f"{group}.name"))
        name = key[len(group) + 1:]
    else:
        schema = next((s for s, p in PREFIX.items() if key.startswith(p) and "." not in key[len(p):]), None)
        name = key[len(PREFIX[schema]):] if schema is not None else key
    found = {f.name: f for f in dataclasses.fields(schema)}.get(name) if schema is not None else None
    if found is None:
        return ABSENT
    if found.default is not dataclasses.MISSING:
        return found.default
    return found.default_factory() if found.default_factory is not dataclasses.MISSING else ABSENT


def setting_differences(a: dict, b: dict, vary: list[str]) -> tuple[list, list]:
    """(declared, undeclared) differences: lists of (key, value_a, value_b). A key one run's
    config lacks (written before the key existed) differs only where the other run's value is
    not the schema's default (:func:`schema_default`)."""
    declared, undeclared = [], []
    for key in sorted(set(a) | set(b)):
        if ignored(key):
            continue
        va, vb = a.get(key, ABSENT), b.get(key, ABSENT)
        if (va == ABSENT and vb == schema_default(key, b)) or (vb == ABSENT and va == schema_default(key, a)):
            continue
        if va != vb:
            (declared if _declared(key, vary) else undeclared).append((key, va, vb))
    return declared, undeclared


def compare_runs(run_a: Path, run_b: Path, vary: list[str], force: bool = False) -> dict:
    """Compare two runs.

    Args:
        run_a, run_b: run directories. vary: the declared A/B variables (config keys or
            prefixes, ``env.<key>`` for environment facts). force: compare despite
            undeclared differences (they are listed loudly in the result).
    Raises:
        UndeclaredDifference: undeclared differences and ``force`` is False.
    """
    declared, undeclared = setting_differences(load_settings(run_a), load_settings(run_b), vary)
    if undeclared and not force:
        lines = "\n".join(f"  {k}: {va!r} vs {vb!r}" for k, va, vb in undeclared)
        raise UndeclaredDifference(
            f"{run_a} and {run_b} differ in settings not declared as the A/B variable (--vary):\n{lines}\n"
            f"declare them with --vary KEY (e.g. --vary {undeclared[0][0]}) or pass --force")
    ra, rb = build_report(run_a), build_report(run_b)
    rows = []
    for name in ("step_s", *PHASES, "unattributed"):
        a = ra["overall"]["keys"].get(name, {}).get("median")
        b = rb["overall"]["keys"].get(name, {}).get("median")
        if not a and not b:
            continue
        rows.append({"name": name, "a": a, "b": b, "ratio": b / a if a and b is not None else None})
    for name, ka, kb in (("global_rays_per_s", ra["global_rays_per_s"], rb["global_rays_per_s"]),
                         ("test_psnr", ra["test_psnr"], rb["test_psnr"]),
                         ("startup_s (rank 0)", ra["per_rank"][0]["startup_s"], rb["per_rank"][0]["startup_s"]),
                         ("compile_s (rank 0)", (ra["compile"].get(0) or {}).get("compile_s"),
                          (rb["compile"].get(0) or {}).get("compile_s"))):
        rows.append({"name": name, "a": ka, "b": kb, "ratio": kb / ka if ka and kb is not None else None})
    return {"run_a": str(run_a), "run_b": str(run_b), "vary": vary, "declared": declared, "undeclared": undeclared,
            "forced": bool(undeclared), "rows": rows}


def to_markdown(result: dict) -> str:
    lines = [f"# A/B: {result['run_a']} (A) vs {result['run_b']} (B)", ""]
    if result["undeclared"]:
        lines += ["**WARNING: the runs differ in undeclared settings (--force); the comparison is not an A/B:**", ""]
        lines += [f"- `{k}`: {va!r} vs {vb!r}" for k, va, vb in result["undeclared"]] + [""]
    lines += ["Declared A/B variable(s): " + (", ".join(f"`{k}` {va!r} -> {vb!r}" for k, va, vb in result["declared"])
                                            or "none differ"), "",
              "Phases: median over all ranks' steady steps (ms); start-up is the skipped leading steps.", "",
              "| figure | A | B | B/A |", "|---|---:|---:|---:|"]
    for r in result["rows"]:
        scale = 1e3 if r["name"] in ("step_s", *PHASES, "unattributed") else 1.0
        fmt = lambda v: "-" if v is None else f"{v * scale:.4g}"  # noqa: E731
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        lines.append(f"| {r['name']} | {fmt(r['a'])} | {fmt(r['b'])} | {ratio} |")
    return "\n".join(lines) + "\n"
