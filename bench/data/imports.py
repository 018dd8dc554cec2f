"""Import time and peak memory of user-format scenes (issue 15): the built-in city through its
COLMAP and nerfstudio copies, and lego converted to COLMAP text and to nerfstudio.

    python -m bench.data.imports [--repeats 3] [--kinds city_small city] [--lego PATH]
        [--out bench/data/results/import/bench_import.json]

For each case a fresh subprocess loads the **train** split with ``distnerf.data.load_scene``
(pixels decoded into RAM, the default) and reports its wall time and its peak RSS (``VmHWM`` of
``/proc/self/status``) minus its RSS before the load (the interpreter with torch imported). The
scenes are prepared first, outside the timing: the city generated with
``python -m distnerf.data.synthetic`` (its generation time is reported too), lego converted with
``python -m distnerf.data.convert``. Medians of ``--repeats`` runs; the Blender-format load of the
same scene is measured beside each one, in the same invocation, as the reference.

Writes JSON (``--out``) with a ``meta`` block (see ``bench/common.py``). Run on a quiet machine:
``/work/shared/tools/quiet -- python -m bench.data.imports``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


from bench.common import ROOT, default_out, start_meta, status_mb, write_result

def worker(cfg: dict) -> None:
    """A fresh process (``python -m bench.data.imports worker JSON``): load the train split of dataset config
    ``cfg``; prints one JSON line: seconds, peak memory above the start (MiB), images and pixels."""
    import torch

    from distnerf.data import load_scene

    torch.set_num_threads(1)
    before = status_mb("VmRSS")
    start = time.perf_counter()
    scene = load_scene(cfg, "train")
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "peak_mb": status_mb("VmHWM") - before, "images": len(scene),
                      "pixels": int(scene.images.shape[0] * scene.images.shape[1] * scene.images.shape[2])}))


def measure(cfg: dict, repeats: int) -> dict:
    runs = []
    for _ in range(repeats):
        proc = subprocess.run([sys.executable, "-m", "bench.data.imports", "worker", json.dumps(cfg)], capture_output=True, text=True,
                              cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode != 0:
            raise SystemExit(f"loading {cfg} failed:\n{proc.stderr[-3000:]}")
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {"dataset": cfg, "images": runs[0]["images"], "pixels": runs[0]["pixels"],
            "seconds": [round(r["seconds"], 3) for r in runs],
            "seconds_median": round(statistics.median(r["seconds"] for r in runs), 3),
            "peak_mb_median": round(statistics.median(r["peak_mb"] for r in runs), 1)}


def run(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return round(time.perf_counter() - start, 2)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kinds", nargs="+", default=["city_small", "city"])
    parser.add_argument("--lego", default=str(ROOT.parent / "shared" / "data" / "nerf_synthetic_half" / "lego"))
    parser.add_argument("--out", type=Path, default=default_out(__file__, "import/bench_import.json"))
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        return worker(json.loads(argv[1]))
    args = parser.parse_args(argv)
    meta = start_meta()
    work = Path(tempfile.mkdtemp(prefix="bench_import-"))
    cases = []
    for kind in args.kinds:
        out = work / kind
        gen_s = run([sys.executable, "-m", "distnerf.data.synthetic", "--kind", kind, "--out", str(out)])
        root = str(next(p.parent for p in out.rglob("transforms_train.json")))
        case = {"scene": kind, "generation_s": gen_s, "blender": measure({"name": "blender", "root": root}, args.repeats)}
        for name in ("colmap", "nerfstudio"):
            case[name] = measure({"name": name, "root": root}, args.repeats)
        cases.append(case)
    if Path(args.lego).is_dir():
        case = {"scene": "lego", "blender": measure({"name": "blender", "root": args.lego}, args.repeats)}
        for fmt in ("colmap", "nerfstudio"):
            out = work / f"lego_{fmt}"
            case[f"convert_{fmt}_s"] = run([sys.executable, "-m", "distnerf.data.convert", "--to", fmt, "--out", str(out),
                                            "dataset=blender", f"dataset.root={args.lego}"])
            cfg = {"name": fmt, "root": str(out)}
            if fmt == "colmap":  # lego's own split (the converter's lists), not every 8th image
                cfg.update(test_list=str(out / "test_list.txt"), val_list=str(out / "val_list.txt"))
            case[fmt] = measure(cfg, args.repeats)
        cases.append(case)
    write_result(args.out, {"repeats": args.repeats, "split": "train", "cases": cases,
                            "peak_mb": "VmHWM minus VmRSS before the load, MiB"}, meta)
    print(json.dumps(cases, indent=1))


if __name__ == "__main__":
    main()
