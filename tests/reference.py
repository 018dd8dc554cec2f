"""Independent references for the rendering tests: NeRF's quadrature (Eq. 3) as a plain
per-ray, per-sample Python loop in float64 (no torch ops on the packed layout, no cumsum,
no exp of sums: transmittance is the running product of ``1 - alpha``)."""
from __future__ import annotations

import math

import torch


def render_loop(ray_indices, t_starts, t_ends, sigmas, rgbs, num_rays: int, background=None,
                colour_threshold: float = 0.0, in_front=None) -> dict:
    """NeRF Eq. 3 per ray with python floats.

    Args:
        ray_indices, t_starts, t_ends, sigmas: (P,) samples in any order (sorted here by
            (ray, t_start)). rgbs: (P, 3). background: (3,) or None.
        colour_threshold: a sample adds colour only where ``in_front * w_i > threshold``
            (it still attenuates the ray). in_front: (R,) or None (1).
    Returns:
        dict of float64 tensors: ``weights`` (P,) in the input order, ``rgb`` (R, 3),
        ``depth`` (R,), ``opacity`` (R,) = 1 - prod(1 - alpha), ``transmittance`` (R,),
        and ``num_colour`` (int).
    """
    ray = [int(r) for r in ray_indices.tolist()]
    t0, t1, sig = t_starts.tolist(), t_ends.tolist(), sigmas.tolist()
    col = rgbs.tolist()
    bg = [0.0, 0.0, 0.0] if background is None else [float(x) for x in background.tolist()]
    front = [1.0] * num_rays if in_front is None else [float(x) for x in in_front.tolist()]
    order = sorted(range(len(ray)), key=lambda i: (ray[i], t0[i]))
    trans = [1.0] * num_rays
    rgb = [[0.0, 0.0, 0.0] for _ in range(num_rays)]
    depth = [0.0] * num_rays
    weights = [0.0] * len(ray)
    num_colour = 0
    for i in order:
        r = ray[i]
        alpha = 1.0 - math.exp(-sig[i] * (t1[i] - t0[i]))
        w = trans[r] * alpha
        weights[i] = w
        if front[r] * w > colour_threshold:
            num_colour += 1
            for c in range(3):
                rgb[r][c] += w * col[i][c]
        depth[r] += w * 0.5 * (t0[i] + t1[i])
        trans[r] *= 1.0 - alpha
    if background is not None:
        for r in range(num_rays):
            for c in range(3):
                rgb[r][c] += trans[r] * bg[c]
    f64 = torch.float64
    return {"weights": torch.tensor(weights, dtype=f64), "rgb": torch.tensor(rgb, dtype=f64).view(num_rays, 3),
            "depth": torch.tensor(depth, dtype=f64), "opacity": 1.0 - torch.tensor(trans, dtype=f64),
            "transmittance": torch.tensor(trans, dtype=f64), "num_colour": num_colour}
