"""Export a run: ``python -m distnerf.export run_dir=PATH [format=weights|ply|mesh] [out=FILE] [checkpoint=DIR]``.

``format=weights`` (the default) writes the newest committed checkpoint's model weights, step and
the model, dataset and strategy config (no optimizer, RNG or sampler state) to ``out`` (default
``RUN/export/model_step_N.pt``), through a temp file and a rename:

- ``ddp``: ``{"model": state_dict, "step", "config"}``;
- ``ss`` (independent or joint): a fused export, ``{"regions": {k: state_dict}, "partition",
  "step", "config"}``: every region's sub-model in one file.

Render it with ``python -m distnerf.render run_dir=PATH weights=FILE``.

``format=ply`` and ``format=mesh`` write what other tools open (MeshLab, Blender, CloudCompare,
trimesh, Open3D): a binary PLY in the capture's own frame (the run's scene transform inverted), of
the field sampled on a ``lattice``^3 lattice over the scene box (:mod:`distnerf.engine.surface`):

- ``ply``: a coloured point cloud, the lattice points whose density exceeds ``threshold``
  (default ``RUN/export/points_step_N.ply``; x, y, z, nx, ny, nz, red, green, blue);
- ``mesh``: marching cubes at density ``threshold``, vertex colours from the colour field looking
  inward along the normal (default ``RUN/export/mesh_step_N.ply``; vertices as above, faces).

An ``ss`` run (independent or joint, or an ``ss`` weights file via ``weights=``) is exported as one
field: the density and colour at a point are its owning region's, on one lattice, so a surface
crossing a region face has no seam. Both need the ``export`` extra (scikit-image, plyfile).
"""
from __future__ import annotations

import sys
import json
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from . import cli as C
from .checkpoint import SCENE_TRANSFORM_FILE, CheckpointError
from .fileio import atomic_torch_save
from .data import load_scene
from .data.images import undecoded
from .distributed import DistEnv
from .engine import surface
from .engine.runs import find_checkpoint, load_renderer, load_run_config, load_weights
from .config_check import ConfigError
from .schema import RenderConfig
from .strategy.ss_loading import region_states, shared_state

ENTRY = C.Entry(
    "export", "Write a run's model weights (newest committed checkpoint, no optimizer state) to one file, "
    "for distnerf-render weights=FILE; or its coloured point cloud or mesh as PLY in the capture's frame.",
    "run_dir=PATH [format=weights|ply|mesh] [out=FILE] [checkpoint=DIR] [lattice=N] [threshold=SIGMA]",
    [C.Key("run_dir", "(required)", "the run's directory (RUN/config.yaml, RUN/checkpoints/)"),
     *C.schema_keys(RenderConfig, only=["format", "out", "checkpoint", "weights", "lattice", "threshold"])],
    examples=["run_dir=runs/main", "run_dir=runs/main out=lego.pt checkpoint=runs/main/checkpoints/step_00000500",
              "run_dir=runs/main format=mesh lattice=256 threshold=10", "run_dir=runs/city_ss format=ply"],
    notes="The file written is printed on stdout.",
    required=[("run_dir", "the run to export")], existing=["run_dir", "checkpoint"])


def main(argv: list[str] | None = None) -> Path:
    argv = ENTRY.parse(sys.argv[1:] if argv is None else argv)
    with ENTRY.usage_errors():  # no config.yaml, an unknown key, a wrong value: one line, exit 2
        cfg, run_dir = load_run_config(argv, prog=ENTRY.prog)
    if cfg.format != "weights":
        return export_geometry(cfg, run_dir)
    config = OmegaConf.to_container(OmegaConf.masked_copy(cfg, ["model", "dataset", "strategy"]), resolve=True)
    if cfg.strategy.name == "ss":
        found, manifest = find_checkpoint(cfg, run_dir)
        partition, step = manifest["partition"], int(manifest["step"])
        state = region_states(found)
        blob = {"regions": {k: state(k) for k in range(len(partition["boxes"]))}, "partition": partition,
                "step": step, "config": config, "shared": shared_state(found)}
    else:
        model_state, step = load_weights(cfg, run_dir)
        blob = {"model": model_state, "step": step, "config": config}
    transform = run_dir / SCENE_TRANSFORM_FILE  # weights are in the scene's normalised frame: say which
    if transform.is_file():
        blob["scene_transform"] = json.loads(transform.read_text())
    out = Path(cfg.out or run_dir / "export" / f"model_step_{step}.pt")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_torch_save(blob, out)
    print(out)
    return out


def export_geometry(cfg, run_dir: Path) -> Path:
    """``format=ply|mesh``: the run's field (an ``ss`` run's fused across regions) as a PLY file in the
    capture's frame; the file, its size and the time taken are logged on stderr."""
    start = time.perf_counter()
    use_cuda = cfg.device != "cpu" and torch.cuda.is_available()
    env = DistEnv(device=torch.device("cuda" if use_cuda else "cpu"))  # one process holds every region
    scene = load_scene(cfg.dataset, "test", pixels=undecoded)  # box and frame: no pixels
    if scene.ndc is not None:  # the field lives in normalised device coordinates, not in a world frame
        raise ConfigError(f"format={cfg.format}: {run_dir} was trained in NDC (a forward-facing LLFF scene); "
                          f"a point cloud or mesh needs a world-space run (dataset.ndc=false)")
    if cfg.strategy.name == "ss":
        cfg.fusion = "segment"  # the owning region's field (blend mixes overlapping regions)
        fused, step = load_renderer(cfg, run_dir, scene, env)
        field = surface.region_field(dict(zip(fused.regions, fused.models)), fused.partition)
    else:
        model, step = load_renderer(cfg, run_dir, scene, env)
        field = surface.model_field(model)
    box = np.asarray(scene.aabb, np.float64).reshape(2, 3)
    volume = surface.sample_lattice(field, box, cfg.lattice)
    transform = json.loads((run_dir / SCENE_TRANSFORM_FILE).read_text()) \
        if (run_dir / SCENE_TRANSFORM_FILE).is_file() else scene.transform
    if cfg.format == "mesh":
        vertices, faces, normals, colours = surface.extract_mesh(field, box, cfg.lattice, cfg.threshold, volume)
    else:
        vertices, normals, colours = surface.point_cloud(field, box, cfg.lattice, cfg.threshold, volume)
        faces = None
    vertices, normals = surface.to_capture_frame(vertices, normals, transform)
    name = "mesh" if cfg.format == "mesh" else "points"
    out = Path(cfg.out or run_dir / "export" / f"{name}_step_{step}.ply")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_ply(out, vertices, normals, colours, faces)
    print(f"{out}: {len(vertices)} vertices, {0 if faces is None else len(faces)} faces, "
          f"{out.stat().st_size / 1e6:.2f} MB, {time.perf_counter() - start:.1f} s", file=sys.stderr)
    print(out)
    return out


def write_ply(path: Path, vertices: np.ndarray, normals: np.ndarray, colours: np.ndarray,
              faces: np.ndarray | None = None) -> None:
    """A binary little-endian PLY through a temp file and a rename: ``vertex`` (x, y, z, nx, ny, nz
    float32; red, green, blue uchar) and, for a mesh, ``face`` (vertex_indices, a list of int32).

    Args:
        vertices, normals: (V, 3) float. colours: (V, 3) uint8. faces: (F, 3) int or None.
    Raises:
        ImportError: plyfile missing (``pip install 'distnerf[export]'``).
    """
    try:
        from plyfile import PlyData, PlyElement
    except ImportError as err:
        raise ImportError("format=ply|mesh needs plyfile: pip install 'distnerf[export]'") from err
    vertex = np.empty(len(vertices), dtype=[("x", "f4"), ("y", "f4"), ("z", "f4"), ("nx", "f4"), ("ny", "f4"),
                                            ("nz", "f4"), ("red", "u1"), ("green", "u1"), ("blue", "u1")])
    for i, axis in enumerate("xyz"):
        vertex[axis], vertex["n" + axis] = vertices[:, i], normals[:, i]
    for i, channel in enumerate(("red", "green", "blue")):
        vertex[channel] = colours[:, i]
    elements = [PlyElement.describe(vertex, "vertex")]
    if faces is not None:
        face = np.empty(len(faces), dtype=[("vertex_indices", "i4", (3,))])
        face["vertex_indices"] = faces
        elements.append(PlyElement.describe(face, "face"))
    tmp = path.with_name(path.name + ".tmp")
    PlyData(elements, text=False).write(str(tmp))
    tmp.replace(path)


def cli(argv: list[str] | None = None) -> int:
    """``distnerf-export`` / ``python -m distnerf.export``: :func:`main`; a config error is one line (exit 2), a
    missing or damaged checkpoint one line (exit 1)."""
    return ENTRY.run(main, argv, (FileNotFoundError, CheckpointError), ConfigError)  # no checkpoint yet, a damaged one


if __name__ == "__main__":
    sys.exit(cli())
