"""Evaluation speed of a change to a few modules, measured in one process (BENCHMARKS.md, lego budget).

    python -m bench.throughput.eval_swap RUN_DIR --baseline REV --modules distnerf/renderer/packed.py ...
        [--views 8] [--threads 2] [--out bench/throughput/results/RUN_NAME/bench_eval_swap.json]

This machine's speed differs between processes by more than a small change does (fresh workers of
one commit measured 0.80 to 1.16 s per lego view), so ``bench/throughput/engine.py``'s comparisons between
processes cannot resolve a few percent. Here both versions run in the same process: the listed
modules' source at ``REV`` (``git show``) is loaded beside the checkout's, and for the baseline's
turns every reference in the ``distnerf`` package to one of their top-level functions (the module's
own attribute and the names other modules imported from it) points at the baseline's function of
that name, and the baseline modules call each other's functions (a name one imported from another
listed module is relinked to the baseline's); a function of a module not listed stays the
checkout's in both turns. Classes and constants stay the checkout's: only a change confined to functions of the
listed modules is measured. The two versions render the same ``--views`` test views of the run's
checkpoint, alternating per view (order flipped every view) after one warm-up render each.

Writes JSON (``meta``: command, date, commit, load before/after): per-view seconds and PSNR of each
version, their medians and ``baseline_over_checkout``. Run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path


from bench.common import ROOT, default_out, start_meta, write_result


def load_eval_model(run_dir: Path):
    """A trained run's model for evaluation on the CPU, eager (``model.compile`` off): ``(cfg, run_dir,
    test scene, model in eval mode, step)``; its weights are the newest committed checkpoint's."""
    from omegaconf import OmegaConf

    from distnerf.data import load_scene
    from distnerf.engine.runs import load_run_config, load_weights
    from distnerf.model import build_model

    cfg, run_dir = load_run_config([f"run_dir={run_dir}"])
    model_cfg = {k: v for k, v in OmegaConf.to_container(cfg.model, resolve=True).items()
                 if k not in ("compile", "compile_mode")}
    state, step = load_weights(cfg, run_dir)
    scene = load_scene(OmegaConf.to_container(cfg.dataset, resolve=True), "test")
    model = build_model(model_cfg, scene.aabb, scene.background)
    model.load_state_dict(state)
    model.eval()
    return cfg, run_dir, scene, model, step


def load_baseline_module(path: str, rev: str) -> tuple[types.ModuleType, types.ModuleType]:
    """(the checkout's module, the same module's source at ``rev``) for a path like
    ``distnerf/renderer/packed.py``; the baseline's relative imports resolve to the checkout's package.
    Raises subprocess.CalledProcessError when ``rev`` lacks the file."""
    name = path.removesuffix(".py").replace("/", ".")
    live = importlib.import_module(name)
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], check=True, capture_output=True,
                            text=True).stdout
    shadow = types.ModuleType(f"{name}__baseline", f"{path} at {rev}")
    shadow.__package__, shadow.__file__ = name.rpartition(".")[0], f"{rev}:{path}"
    sys.modules[shadow.__name__] = shadow  # dataclasses look their module up
    exec(compile(source, shadow.__file__, "exec"), shadow.__dict__)
    return live, shadow


def swap_table(pairs) -> dict[int, tuple]:
    """id(checkout's function) -> (checkout's function, baseline's function) for every top-level function
    both versions of a module define."""
    table = {}
    for live, shadow in pairs:
        for key, fn in vars(live).items():
            other = getattr(shadow, key, None)
            if isinstance(fn, types.FunctionType) and fn.__module__ == live.__name__ and isinstance(other, types.FunctionType):
                table[id(fn)] = (fn, other)
    return table


def link_baselines(pairs, table: dict[int, tuple]) -> int:
    """Make the baseline modules call each other: a name one of them imported from another listed
    module (``from .packed import render_transmittance``) resolved to the checkout's function when it
    was loaded; point it at the baseline's. Returns how many names it relinked."""
    n = 0
    for _, shadow in pairs:
        for key, value in list(vars(shadow).items()):
            if id(value) in table and table[id(value)][0] is value:
                setattr(shadow, key, table[id(value)][1])
                n += 1
    return n


def point_at(table: dict[int, tuple], baseline: bool) -> int:
    """Point every ``distnerf`` module attribute holding one of ``table``'s functions at the baseline's
    version (``baseline``) or back at the checkout's; returns how many references it set."""
    by_id = {id(pair[0 if baseline else 1]): pair[1 if baseline else 0] for pair in table.values()}
    n = 0
    for mod_name, mod in list(sys.modules.items()):
        if not mod_name.startswith("distnerf") or mod_name.endswith("__baseline") or mod is None:
            continue
        for key, value in list(vars(mod).items()):
            if id(value) in by_id:
                setattr(mod, key, by_id[id(value)])
                n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--modules", nargs="+", required=True, metavar="PATH")
    ap.add_argument("--views", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    meta = start_meta()

    import torch

    from distnerf.engine.evaluate import render_image, select_views
    from distnerf.observe.metrics import psnr

    torch.set_num_threads(args.threads)
    cfg, run_dir, scene, model, step = load_eval_model(args.run_dir)
    pairs = [load_baseline_module(p, args.baseline) for p in args.modules]
    table = swap_table(pairs)
    link_baselines(pairs, table)
    chunk, device = int(cfg.eval.chunk), torch.device("cpu")
    views = select_views(len(scene), args.views)
    rows = {"checkout": [], "baseline": []}
    swapped = 0
    for i, v in enumerate([views[0], *views]):  # the first pass warms both versions up
        for name in (("checkout", "baseline") if i % 2 == 0 else ("baseline", "checkout")):
            swapped = max(swapped, point_at(table, name == "baseline"))
            start = time.perf_counter()
            out = render_image(model, scene, v, chunk, device)
            seconds = time.perf_counter() - start
            point_at(table, False)
            if i:
                rows[name].append({"view": v, "seconds": seconds, "psnr": psnr(out["rgb"], scene.images[v])})
    med = {k: statistics.median(r["seconds"] for r in v) for k, v in rows.items()}
    report = {"run_dir": str(run_dir), "step": step, "baseline": args.baseline, "modules": args.modules,
              "functions_swapped": sorted(pair[0].__qualname__ for pair in table.values()),
              "references_swapped": swapped, "threads": args.threads, "chunk": chunk, "views": views, "rows": rows,
              "checkout_seconds_median": med["checkout"], "baseline_seconds_median": med["baseline"],
              "baseline_over_checkout": med["baseline"] / med["checkout"],
              "psnr_checkout_minus_baseline": statistics.mean(r["psnr"] for r in rows["checkout"])
              - statistics.mean(r["psnr"] for r in rows["baseline"])}
    print(f"checkout {med['checkout']:.3f} s/view, {args.baseline} {med['baseline']:.3f} s/view: "
          f"{report['baseline_over_checkout']:.3f}x ({swapped} references to {len(table)} functions swapped)")
    write_result(args.out or default_out(__file__, f"{Path(run_dir).name}/bench_eval_swap.json"), report, meta)


if __name__ == "__main__":
    main()
