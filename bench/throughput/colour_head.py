"""The grid model's colour head alone: milliseconds of a forward and backward over a batch of points, per head.

    python -m bench.throughput.colour_head [--points 65536] [--repeats 15] [--threads 2]
        [--out bench/throughput/results/colour_head/colour_head.json]

Each configuration builds a :class:`~distnerf.model.grid.GridModel` with the defaults but for the colour keys
(``model.color``, ``model.viewdir_encoding``, ``model.sh_degree``) and times
:func:`distnerf.model.grid_color.shade` on random features (P, C) and unit view directions (P, 3), one
direction per point, then ``backward`` of the colours' sum into the features and the colour network. The
configurations alternate (order reversed every repeat) after one warm-up each, so load drifts touch them
alike; the figure is the median. Only the head: no table interpolation, no marching, no optimizer.

Writes JSON (``meta``: command, date, commit, load before/after): per configuration its feature channels C,
the colour network's parameters, per-repeat milliseconds and the median. Run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.common import default_out, start_meta, write_result
from distnerf.model.grid import GridModel
from distnerf.model.grid_color import shade

CONFIGS = {  # label -> the model keys that differ from the defaults
    "sh head, degree 1": {"color": "sh", "sh_degree": 1},
    "sh head, degree 2": {"color": "sh", "sh_degree": 2},
    "mlp head, frequency directions (L=4)": {"color": "mlp", "viewdir_encoding": "frequency"},
    "mlp head, sh directions (degree 2)": {"color": "mlp", "viewdir_encoding": "sh", "sh_degree": 2},
}


def head_step_ms(model: GridModel, feats: torch.Tensor, dirs: torch.Tensor) -> float:
    """Milliseconds of one forward (:func:`shade`) and backward of the colour head."""
    feats = feats.detach().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    sh_degree = model.cfg.sh_degree if model.cfg.color == "sh" else None
    rgb = shade(feats, dirs, None, None, sh_degree=sh_degree, color_net=model.color_net,
                dir_encoding=model.dir_encoding, appearance=None)
    rgb.sum().backward()
    return (time.perf_counter() - start) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=65536, help="P, points shaded at once")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=default_out(__file__, "colour_head") / "colour_head.json")
    args = parser.parse_args(argv)
    meta = start_meta()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    box = torch.tensor([[-1.0] * 3, [1.0] * 3])
    cases = {}
    for label, keys in CONFIGS.items():
        torch.manual_seed(0)
        model = GridModel(box, torch.ones(3), resolutions=[8], upsample_steps=[], **keys)
        channels = model.features.shape[1]
        dirs = torch.nn.functional.normalize(torch.randn(args.points, 3, generator=gen), dim=-1)
        feats = torch.randn(args.points, channels, generator=gen)
        head_step_ms(model, feats, dirs)  # warm-up
        cases[label] = (model, feats, dirs, [])
    labels = list(cases)
    for repeat in range(args.repeats):
        for label in (labels if repeat % 2 == 0 else labels[::-1]):
            model, feats, dirs, times = cases[label]
            times.append(head_step_ms(model, feats, dirs))
    rows = []
    for label, (model, feats, dirs, times) in cases.items():
        median = statistics.median(times)
        rows.append({"config": label, "keys": CONFIGS[label], "feature_channels": feats.shape[1],
                     "colour_net_params": sum(p.numel() for p in model.color_net.parameters()),
                     "ms": [round(t, 3) for t in times], "ms_median": round(median, 3),
                     "points_per_s_median": round(args.points / median * 1e3)})
        print(f"{label}: {median:.2f} ms per forward + backward of {args.points} points")
    write_result(args.out, {"points": args.points, "threads": args.threads, "repeats": args.repeats, "rows": rows},
                 meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
