"""The export of trained runs to PLY, timed and pictured (bench/quality/import_export.md, "Export").

    python -m bench.quality.export NAME=RUN_DIR [NAME=RUN_DIR ...] [--lattice 256] [--threshold 10]
        [--out bench/quality/results/export]

For each run: ``python -m distnerf.export run_dir=RUN format=ply`` and ``format=mesh`` in fresh
processes (``wall_s``: the process, imports included; ``export_s``: what the export reports, from
loading the scene and the checkpoint to the file written),
each file read back with ``plyfile`` (vertex and face counts, bounding box in the capture's frame);
the run's steps, strategy and test PSNR; a picture of the mesh (matplotlib, offscreen:
``NAME_mesh.png``). Writes ``export.json`` (adding to the runs already there) and appends the meta block (command, commit) to ``meta.json``
in ``--out``. The PLY files themselves stay in the run directory (too large to commit).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import ROOT, append_meta, default_out, finish_meta, start_meta


def export(run: Path, fmt: str, lattice: int, threshold: float, out: Path) -> dict:
    cmd = [sys.executable, "-m", "distnerf.export", f"run_dir={run}", f"format={fmt}", f"lattice={lattice}",
           f"threshold={threshold}", f"out={out}"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    said = [ln for ln in proc.stderr.splitlines() if ln.startswith(str(out))][-1]  # "...: N vertices, ..., T s"
    export_s = float(said.rsplit(",", 1)[1].strip().split()[0])
    from plyfile import PlyData

    ply = PlyData.read(str(out))
    v = ply["vertex"]
    xyz = np.stack([v["x"], v["y"], v["z"]], -1)
    return {"format": fmt, "wall_s": round(wall, 2), "export_s": export_s, "bytes": out.stat().st_size,
            "vertices": len(xyz), "faces": len(ply["face"]) if "face" in ply else 0,
            "bounds": [xyz.min(0).round(4).tolist(), xyz.max(0).round(4).tolist()],
            "command": " ".join(["python", *cmd[1:]])}


def picture(mesh_path: Path, png: Path, title: str, up: np.ndarray, max_faces: int = 600000) -> None:
    """The mesh in matplotlib's 3D axes (offscreen), faces in their vertices' mean colour times a Lambert
    term (the exported colours are unlit; shading shows the shape), ``up`` vertical."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from mpl_toolkits.mplot3d.art3d import Poly3DCollection
    from plyfile import PlyData

    ply = PlyData.read(str(mesh_path))
    v = ply["vertex"]
    xyz = np.stack([v["x"], v["y"], v["z"]], -1).astype(np.float64)
    rgb = np.stack([v["red"], v["green"], v["blue"]], -1) / 255.0
    faces = np.stack(ply["face"]["vertex_indices"])
    if len(faces) > max_faces:  # matplotlib sorts every polygon: keep an even subset of a large mesh
        faces = faces[np.linspace(0, len(faces) - 1, max_faces).astype(int)]
    # a frame whose z is ``up`` (matplotlib's vertical axis)
    up = up / np.linalg.norm(up)
    side = np.cross(up, [1.0, 0.0, 0.0] if abs(up[0]) < 0.9 else [0.0, 1.0, 0.0])
    side /= np.linalg.norm(side)
    basis = np.stack([side, np.cross(up, side), up])
    pts = (xyz - xyz.mean(0)) @ basis.T
    fig = plt.figure(figsize=(6, 6), dpi=110)
    ax = fig.add_subplot(projection="3d")
    tri = pts[faces]
    normal = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    normal /= np.maximum(np.linalg.norm(normal, axis=-1, keepdims=True), 1e-12)
    light = np.array([0.4, -0.5, 0.77]) / np.linalg.norm([0.4, -0.5, 0.77])  # from above, the viewer's side
    shade = 0.45 + 0.55 * np.abs(normal @ light)[:, None]  # a little Lambert shading to show the shape
    ax.add_collection3d(Poly3DCollection(tri, facecolors=np.clip(rgb[faces].mean(1) * shade, 0, 1),
                                         edgecolors="none"))
    half = np.abs(pts).max()
    ax.set(xlim=(-half, half), ylim=(-half, half), zlim=(-half, half), title=title)
    ax.view_init(elev=25, azim=-60)
    ax.set_box_aspect((1, 1, 1), zoom=1.5)
    ax.set_axis_off()
    fig.savefig(png, bbox_inches="tight")
    plt.close(fig)


def run_facts(run: Path) -> dict:
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    metrics = json.loads((run / "metrics.json").read_text()) if (run / "metrics.json").exists() else {}
    steps = sorted((run / "checkpoints").glob("step_*"))
    return {"dataset": cfg["dataset"].get("name"), "strategy": cfg["strategy"]["name"],
            "training": cfg["strategy"].get("training"), "num_regions": cfg["strategy"].get("num_regions"),
            "steps": int(steps[-1].name.split("_")[1]) if steps else None,
            "test_psnr": metrics.get("psnr", metrics.get("test_psnr"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="NAME=RUN_DIR")
    ap.add_argument("--lattice", type=int, default=256)
    ap.add_argument("--threshold", type=float, default=10.0)
    ap.add_argument("--up", action="append", default=[], help="NAME=x,y,z: the picture's vertical (default +z)")
    ap.add_argument("--out", type=Path, default=default_out(__file__, "export"))
    args = ap.parse_args()
    meta = start_meta()
    args.out.mkdir(parents=True, exist_ok=True)
    ups = {k: np.array([float(x) for x in v.split(",")]) for k, v in (u.split("=", 1) for u in args.up)}
    report, files = {}, ["export.json"]
    for item in args.runs:
        name, run = item.split("=", 1)
        run = Path(run)
        row = {"run": run_facts(run), "lattice": args.lattice, "threshold": args.threshold, "exports": []}
        for fmt in ("ply", "mesh"):
            out = run / "export" / f"{name}_{fmt}.ply"
            row["exports"].append(export(run, fmt, args.lattice, args.threshold, out))
            print(name, row["exports"][-1], flush=True)
        picture(run / "export" / f"{name}_mesh.ply", args.out / f"{name}_mesh.png",
                f"{name}: {row['exports'][-1]['vertices']} vertices", ups.get(name, np.array([0.0, 0.0, 1.0])))
        files.append(f"{name}_mesh.png")
        report[name] = row
    path = args.out / "export.json"  # runs measured by earlier invocations stay
    report = {**(json.loads(path.read_text()) if path.exists() else {}), **report}
    path.write_text(json.dumps(report, indent=1) + "\n")
    append_meta(args.out, {"files": files, **finish_meta(meta)})


if __name__ == "__main__":
    main()
