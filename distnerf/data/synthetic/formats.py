"""A city scene on disk: its images and the same cameras in three formats.

Legend: V views of the flight, P 3D points, H, W image size in pixels.

:func:`write_city` renders every view of a city's flight into ``images/`` and writes::

    <root>/images/img_<iiii>.png          RGB, 8 bit, opaque; flight order
    <root>/transforms_{train,val,test}.json   Blender layout (distnerf's load_blender)
    <root>/transforms.json                nerfstudio layout, every view + split lists
    <root>/sparse/0/{cameras,images,points3D}.txt   COLMAP text model
    <root>/appearance.json                image name -> RGB gain (3,), the ground truth
    <root>/colmap_from_scene.json         the similarity from the scene to the COLMAP frame

Blender and nerfstudio files use the scene frame (+Y up, ground y = 0) and OpenGL
``c2w`` (``transform_matrix``; camera looks down -Z); per-frame pinhole intrinsics
``fl_x, fl_y, cx, cy`` (and ``w``, ``h``) in pixels, since the flight has two cameras;
``file_path`` is relative to the scene root (``images/img_0000.png``). No
``applied_transform`` is written (identity). The Blender files also carry ``near``,
``far``, ``aabb`` (world units) and ``world_up``; nerfstudio's carries
``camera_model: "PINHOLE"``, ``train_filenames``, ``val_filenames``, ``test_filenames``
(the ``file_path`` strings of each split) and ``colmap_im_id`` per frame.

COLMAP (https://colmap.github.io/format.html): camera 1 (nadir) and 2 (oblique), model
``PINHOLE`` with ``fx fy cx cy``; image ``i`` of the flight has ``IMAGE_ID = i + 1``,
pose ``QW QX QY QZ TX TY TZ`` the world-to-camera rotation (unit quaternion, ``QW >= 0``)
and translation in the OpenCV camera frame (x right, y down, z forward), pixel centres at
``+0.5`` as in the other formats. COLMAP's world is the scene frame moved by a known
random similarity ``X_colmap = s R X_scene + t`` (``colmap_from_scene.json``: ``matrix``
4x4 ``[[s R, t], [0, 1]]``, ``scale`` s). The 3D points are sampled uniformly on the
buildings' roofs and facades (half of them) and on the ground (the other half); an image
observes a point when the point is in front of the camera, projects inside the image and
is not occluded (the ray from the camera centre first hits the surface within
:data:`VISIBILITY_TOLERANCE` of the point); points seen by fewer than two images are
dropped. ``POINTS2D`` are exact projections, ``ERROR`` is 0, colours are the points'
shaded albedo (no appearance gain).

Gains: the PNG values are ``round(255 * clip(rgb * gain, 0, 1))`` of the rendered RGB
(:func:`~distnerf.data.synthetic.tracer.render_view`) and the view's gain.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Tuple

import imageio.v3 as iio
import numpy as np

from distnerf.data.synthetic.primitives import Building, CityGround
from distnerf.data.synthetic.scenes import SceneSpec
from distnerf.data.synthetic.tracer import nearest_hit, render_view, shade

#: Largest gap (world units) between the first hit of the camera-to-point ray and the
#: point for the point to count as seen.
VISIBILITY_TOLERANCE = 1e-5
# Flip of the camera's y and z axes between the OpenGL and OpenCV conventions.
_FLIP = np.diag([1.0, -1.0, -1.0])
SPLITS = ("train", "val", "test")


def write_city(spec: SceneSpec, out_dir: Path, width: int, height: int) -> None:
    """Renders a city's flight and writes images, Blender, nerfstudio and COLMAP files.

    Args:
        spec: a city scene (``spec.survey`` set).
        out_dir: existing directory to write into.
        width, height: image size in pixels.
    """
    survey = spec.survey
    assert survey is not None, "write_city needs a city scene"
    out_dir = Path(out_dir)
    (out_dir / "images").mkdir(exist_ok=True)
    intrinsics = survey.intrinsics(width, height)
    names = survey.names
    for i, name in enumerate(names):
        rgb = render_view(spec, survey.c2w[i], width, height, intrinsics=intrinsics[i])[..., :3]
        value = np.clip(rgb.astype(np.float64) * survey.gains[i], 0.0, 1.0)
        iio.imwrite(out_dir / "images" / name, np.round(value * 255.0).astype(np.uint8))
    paths = [f"images/{name}" for name in names]
    frames = [{"file_path": paths[i], "transform_matrix": survey.c2w[i].tolist(),
               "fl_x": float(k[0]), "fl_y": float(k[1]), "cx": float(k[2]), "cy": float(k[3]),
               "w": width, "h": height} for i, k in enumerate(intrinsics)]
    for split in SPLITS:
        meta = {"near": spec.near, "far": spec.far, "aabb": spec.aabb.tolist(),
                "world_up": [0.0, 1.0, 0.0],
                "frames": [frames[i] for i in survey.splits[split]]}
        _write_json(out_dir / f"transforms_{split}.json", meta)
    studio = {"camera_model": "PINHOLE",
              "frames": [{**frame, "colmap_im_id": i + 1} for i, frame in enumerate(frames)]}
    for split in SPLITS:
        studio[f"{split}_filenames"] = [paths[i] for i in survey.splits[split]]
    _write_json(out_dir / "transforms.json", studio)
    _write_json(out_dir / "appearance.json", {name: survey.gains[i].tolist()
                                              for i, name in enumerate(names)})
    similarity = survey.colmap_from_scene
    scale = float(np.cbrt(np.linalg.det(similarity[:3, :3])))
    _write_json(out_dir / "colmap_from_scene.json", {
        "matrix": similarity.tolist(), "scale": scale,
        "convention": "X_colmap = matrix @ [X_scene, 1]; matrix[:3, :3] = scale * rotation"})
    points, colours = surface_points(spec)
    observations = observe(spec, points, survey.c2w, intrinsics, width, height)
    write_colmap(out_dir / "sparse" / "0", spec, intrinsics[[_first(survey.camera_ids, c)
                                                             for c in (1, 2)]],
                 width, height, points, colours, observations)


def _first(ids: np.ndarray, camera_id: int) -> int:
    """Index of the first view of camera ``camera_id`` (cameras share their intrinsics)."""
    hits = np.flatnonzero(ids == camera_id)
    return int(hits[0]) if hits.size else 0


def _write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=1))


def surface_points(spec: SceneSpec) -> Tuple[np.ndarray, np.ndarray]:
    """Candidate 3D points of the COLMAP model: ``survey.num_points`` surface samples.

    Half on the buildings (roofs and facades, uniform by area over all buildings), half
    uniform on the ground; seeded by ``survey.seed``. Most ground samples under a
    building and many facade samples are never seen and are dropped later.

    Returns:
        points: (P, 3) float64 scene-frame points on the surfaces.
        colours: (P, 3) uint8 shaded albedo (the rendered colour without gain).
    """
    survey = spec.survey
    rng = np.random.default_rng([survey.seed, 300])
    ground = [k for k, p in enumerate(spec.primitives) if isinstance(p, CityGround)]
    buildings = [k for k, p in enumerate(spec.primitives) if isinstance(p, Building)]
    area = np.array([_outer_area(spec.primitives[k]) for k in buildings])
    num_buildings = survey.num_points // 2 if buildings else 0
    per_building = np.bincount(rng.choice(len(buildings), size=num_buildings, p=area / area.sum()),
                               minlength=len(buildings)) if buildings else []
    per_ground = [len(part) for part in np.array_split(np.arange(survey.num_points - num_buildings),
                                                       max(len(ground), 1))]
    pieces = [(k, n) for k, n in zip(buildings + ground, [*per_building, *per_ground]) if n]
    points, normals, index = [], [], []
    for k, n in pieces:
        p, nrm = spec.primitives[k].sample_surface(rng, int(n))
        points.append(p)
        normals.append(nrm)
        index.append(np.full(int(n), k, dtype=np.int64))
    points, normals, index = np.concatenate(points), np.concatenate(normals), np.concatenate(index)
    rgb = shade(spec.primitives, index, points, normals, spec.light_dir, spec.ambient)
    return points, np.round(rgb * 255.0).astype(np.uint8)


def _outer_area(prim: Building) -> float:
    """Roof plus facade area of a building."""
    hx, hy, hz = prim.half_extents
    return 4.0 * (hx * hz + 2.0 * hy * (hx + hz))


def observe(spec: SceneSpec, points: np.ndarray, c2w: np.ndarray, intrinsics: np.ndarray,
            width: int, height: int,
            tolerance: float = VISIBILITY_TOLERANCE) -> List[Tuple[np.ndarray, np.ndarray]]:
    """Which points each view sees, and where.

    A view sees a point when it is in front of the camera, projects inside the image
    (``0 <= u < W``, ``0 <= v < H``) and the first hit of the ray from the camera centre
    towards it is within ``tolerance`` of the point (not occluded).

    Args:
        spec: the scene (its primitives are traced).
        points: (P, 3) float64 scene-frame points.
        c2w: (V, 4, 4) float64 camera-to-world, OpenGL convention.
        intrinsics: (V, 4) float64 ``(fx, fy, cx, cy)``, pixels.
        width, height: image size in pixels.
        tolerance: world units.

    Returns:
        Per view: (point indices (n,) int64 ascending, pixel positions (n, 2) float64
        ``(u, v)``, pixel centres at +0.5).
    """
    out = []
    for view, (fx, fy, cx, cy) in zip(c2w, intrinsics):
        eye = view[:3, 3]
        cam = (points - eye) @ view[:3, :3] @ _FLIP  # OpenCV camera coordinates
        depth = cam[:, 2]
        safe = np.where(depth > 0.0, depth, 1.0)
        u, v = fx * cam[:, 0] / safe + cx, fy * cam[:, 1] / safe + cy
        idx = np.flatnonzero((depth > 0.0) & (u >= 0.0) & (u < width) & (v >= 0.0) & (v < height))
        ray = points[idx] - eye
        dist = np.linalg.norm(ray, axis=1)
        t, _, _ = nearest_hit(spec.primitives, np.broadcast_to(eye, ray.shape).copy(),
                              ray / np.maximum(dist, 1e-12)[:, None])
        seen = idx[np.abs(t - dist) <= tolerance]
        out.append((seen, np.stack([u[seen], v[seen]], axis=1)))
    return out


def rotation_to_quaternion(rot: np.ndarray) -> np.ndarray:
    """(4,) unit quaternion ``(w, x, y, z)`` with ``w >= 0`` of a (3, 3) rotation."""
    m = rot
    trace = m[0, 0] + m[1, 1] + m[2, 2]
    if trace > 0.0:
        s = 2.0 * np.sqrt(trace + 1.0)
        q = [0.25 * s, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s]
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2])
        q = [(m[2, 1] - m[1, 2]) / s, 0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s]
    elif m[1, 1] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2])
        q = [(m[0, 2] - m[2, 0]) / s, (m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s]
    else:
        s = 2.0 * np.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1])
        q = [(m[1, 0] - m[0, 1]) / s, (m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s]
    q = np.array(q)
    q /= np.linalg.norm(q)
    return q if q[0] >= 0.0 else -q


def colmap_poses(c2w: np.ndarray, similarity: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """COLMAP world-to-camera poses of scene-frame cameras.

    With ``X_colmap = s R X_scene + t`` and the scene camera's OpenCV pose
    ``x = R_wc X_scene + t_wc``, the same camera in COLMAP's frame is
    ``x' = (R_wc R^T) X_colmap + (s t_wc - R_wc R^T t)``, i.e. ``x' = s x`` (a rescaled
    camera frame: same pixels).

    Args:
        c2w: (V, 4, 4) float64 scene-frame camera-to-world, OpenGL convention.
        similarity: (4, 4) float64 ``colmap_from_scene``.

    Returns:
        rotations (V, 3, 3) and translations (V, 3), float64, world-to-camera (OpenCV).
    """
    scale = np.cbrt(np.linalg.det(similarity[:3, :3]))
    rot, shift = similarity[:3, :3] / scale, similarity[:3, 3]
    r_wc = np.transpose(c2w[:, :3, :3] @ _FLIP, (0, 2, 1))  # OpenCV world-to-camera
    t_wc = -np.einsum("vij,vj->vi", r_wc, c2w[:, :3, 3])
    rotations = r_wc @ rot.T
    return rotations, scale * t_wc - rotations @ shift


def write_colmap(out_dir: Path, spec: SceneSpec, camera_intrinsics: np.ndarray, width: int,
                 height: int, points: np.ndarray, colours: np.ndarray,
                 observations: List[Tuple[np.ndarray, np.ndarray]]) -> None:
    """Writes ``cameras.txt``, ``images.txt`` and ``points3D.txt`` into ``out_dir``.

    Args:
        out_dir: the model directory (created).
        spec: the city (its survey: poses, camera ids, the similarity).
        camera_intrinsics: (2, 4) ``(fx, fy, cx, cy)`` of cameras 1 and 2, pixels.
        width, height: image size in pixels.
        points: (P, 3) float64 scene-frame candidate points.
        colours: (P, 3) uint8.
        observations: per view, from :func:`observe`.
    """
    survey = spec.survey
    out_dir.mkdir(parents=True, exist_ok=True)
    seen_by = np.zeros(len(points), dtype=np.int64)
    for idx, _ in observations:
        seen_by[idx] += 1
    keep = seen_by >= 2
    point_id = np.cumsum(keep)  # 1-based id of each kept candidate
    tracks: Dict[int, List[str]] = {}
    rotations, translations = colmap_poses(survey.c2w, survey.colmap_from_scene)
    lines = ["# Image list with two lines of data per image:",
             "#   IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME",
             "#   POINTS2D[] as (X, Y, POINT3D_ID)",
             f"# Number of images: {len(survey.c2w)}"]
    for i, (name, (idx, uv)) in enumerate(zip(survey.names, observations)):
        q = rotation_to_quaternion(rotations[i])
        pose = " ".join(f"{x:.15g}" for x in (*q, *translations[i]))
        lines.append(f"{i + 1} {pose} {int(survey.camera_ids[i])} {name}")
        kept = keep[idx]
        row = []
        for k, (p, (u, v)) in enumerate(zip(idx[kept], uv[kept])):
            row.append(f"{u:.6f} {v:.6f} {point_id[p]}")
            tracks.setdefault(int(p), []).append(f"{i + 1} {k}")
        lines.append(" ".join(row))
    (out_dir / "images.txt").write_text("\n".join(lines) + "\n")
    cameras = ["# Camera list with one line of data per camera:",
               "#   CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]", "# Number of cameras: 2"]
    for camera_id, k in zip((1, 2), camera_intrinsics):
        cameras.append(f"{camera_id} PINHOLE {width} {height} " + " ".join(f"{x:.15g}" for x in k))
    (out_dir / "cameras.txt").write_text("\n".join(cameras) + "\n")
    moved = points @ survey.colmap_from_scene[:3, :3].T + survey.colmap_from_scene[:3, 3]
    rows = ["# 3D point list with one line of data per point:",
            "#   POINT3D_ID, X, Y, Z, R, G, B, ERROR, TRACK[] as (IMAGE_ID, POINT2D_IDX)",
            f"# Number of points: {int(keep.sum())}"]
    for p in np.flatnonzero(keep):
        xyz = " ".join(f"{x:.12g}" for x in moved[p])
        rgb = " ".join(str(int(c)) for c in colours[p])
        rows.append(f"{point_id[p]} {xyz} {rgb} 0 " + " ".join(tracks[int(p)]))
    (out_dir / "points3D.txt").write_text("\n".join(rows) + "\n")
