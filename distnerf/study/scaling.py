"""Past this machine, on paper: step time, exposed communication and fused render time at N GPUs.

An analytic model fed with the study's measured per-step figures (α-β cost model of
collectives: Hockney 1994; ring all-reduce and all-gather: Thakur, Rabenseifner & Gropp,
"Optimization of Collective Communication Operations in MPICH", IJHPCA 2005):

* ring all-reduce of ``n`` bytes on ``N`` ranks: ``2 (N-1)/N * n / bw + 2 (N-1) * lat``;
* ring all-gather of ``n`` bytes in total: ``(N-1)/N * n / bw + (N-1) * lat``;
* compute runs at ``compute_s_per_ray``, the **device speed**, an explicit input: seconds
  per training ray of one device (default: the measured figure of the study's world-size-1
  cell, i.e. of one rank of *this* machine, its threads being the "device"; a GPU figure,
  e.g. from ``tools/gpu_check.sh`` output, replaces it), plus ``fixed_s_per_step``, the
  device's seconds per step that do not grow with the rays (the optimizer over dense tables,
  occupancy-grid updates): a step of ``r`` rays computes ``fixed + r * per_ray`` (fitted by
  :func:`fit_compute` to the W = 1 and W = 2 ``ddp`` cells where one global batch gives them
  ``B`` and ``B/2`` rays per rank on the same device; 0 otherwise). **Weak scaling** is the default:
  every rank keeps the measured per-rank batch ``r`` (``rays_per_rank``), the global batch
  is ``B = r N``; **strong scaling** (``mode="strong"``) keeps ``B`` fixed, ``B/N`` per rank,
  and stops at :data:`MIN_RAYS_PER_RANK` rays per rank (below, a step is latency, not
  rays);
* ``ddp``: step = compute + exposed all-reduce (``exposed_fraction`` of it, measured: the share
  of the gradient all-reduce not hidden behind backward) + the step's small all-reduce
  (latency only); the gradient bytes per step do not change with N (each rank all-reduces
  the whole gradient, or its sparse rows);
* ``ss`` independent: step = compute + the small all-reduce: no gradient exchange;
* ``ss`` joint (NeRF-XL): step = compute + the all-gather of ``C`` floats per ray and region
  (``B`` rays, ``K = N`` regions: ``exchange_bytes_per_ray_region * B * N`` bytes) + the small
  all-reduce; its backward is a slice (no communication);
* fused render of an image of ``R`` rays on ``N`` ranks (``K = N`` regions): the single model's
  render seconds per ray divided among the ranks, plus the fusion stage's routing and
  compositing per ray and region (measured), plus the all-gather of the segments
  (``exchange_bytes_per_ray_region * R * N`` bytes).

Every input is listed in :data:`ASSUMPTIONS` with its source; the report prints them with
the predictions, and checks the model **out of sample** (:func:`check_against`): fitted at
world sizes <= 2, it predicts the measured cells above that; a study without such a cell
reports the check as not run.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

INTERCONNECTS = {
    # bandwidth per rank per direction (bytes/s) and per-message latency (s); stated assumptions
    "nvlink": {"bw": 450e9, "lat": 5e-6, "note": "NVLink 4 (H100 SXM), 450 GB/s per direction, 5 us; <= 8 GPUs"},
    "ib200": {"bw": 25e9, "lat": 10e-6, "note": "200 Gb/s InfiniBand (HDR), 25 GB/s, 10 us"},
    "ib400": {"bw": 50e9, "lat": 10e-6, "note": "400 Gb/s InfiniBand (NDR), 50 GB/s, 10 us"},
}
WORLD_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024)
CHECK_TOLERANCE = 0.15  # relative error allowed of the scaling model at the measured points out of sample
FIT_MAX_WORLD_SIZE = 2  # the model is fitted at world sizes <= this; the check predicts the cells above
HOST_LATENCY_S = 50e-6  # gloo message latency over loopback TCP assumed by the check (stated in the report)
MIN_RAYS_PER_RANK = 256  # strong scaling stops where a rank's share of the global batch falls below this
MODES = ("weak", "strong")

ASSUMPTIONS = [
    "compute: a fixed time per step plus the device speed (seconds per ray per device, an input) times the "
    "rays per rank, the two fitted to the W = 1 and W = 2 ddp cells where these ran different rays per rank on "
    "the same device (else all per ray); "
    "weak scaling (rays per rank fixed) unless strong is asked for (B/N per rank, down to 256); no change of "
    "samples per ray with N, no load imbalance",
    "gradient bytes per step are independent of N (every rank all-reduces its whole gradient or sparse rows)",
    "the exposed share of the all-reduce is the measured one at 2 ranks",
    "collectives follow the ring alpha-beta model (Thakur et al. 2005) at the interconnect's bandwidth per "
    "rank and latency; NVLink only up to 8 GPUs (one node)",
    "ss: one region per rank (K = N); joint exchange C floats per ray and region, measured at 2 ranks",
    "fusion: routing and compositing seconds per ray and crossed region as measured; a ray crosses "
    "1 + (c_K - 1) sqrt(N / K) regions at N (c_K: the measured mean at K regions; a ray through a 2-D "
    "ground-plane grid of N cells crosses O(sqrt N)), N when the crossings were not measured; the single "
    "model's render seconds per ray divide among the ranks",
    "input sampling is hidden by the pipelined sampler (its stall is not modelled)",
]


@dataclass
class Measured:
    """The measured inputs of the model (see :data:`ASSUMPTIONS`).

    Attributes:
        compute_s_per_ray: the device speed: seconds of one device per training ray (forward +
            backward + optimizer).
        fixed_s_per_step: seconds of one device per step whatever its rays (0: all per ray).
        global_rays: B, rays per step of the measured cells (strong scaling keeps it).
        grad_bytes: bytes each rank all-reduces per step (``ddp``).
        exposed_fraction: share of the all-reduce not hidden behind backward (0..1).
        exchange_bytes_per_ray_region: ``ss`` joint segment bytes per ray and region.
        render_s_per_ray: the single model's render seconds per ray (inference).
        fusion_s_per_ray_region: routing + compositing seconds per ray and region.
        render_rays: R, rays of one rendered image.
        rays_per_rank: r, the per-rank batch weak scaling keeps (0: ``global_rays``, the
            batch of one rank at world size 1).
        device: where ``compute_s_per_ray`` comes from (printed with the predictions).
        regions_crossed, measured_regions: c_K, the measured mean number of regions a ray crosses at K
            regions (:func:`crossed_regions` extrapolates it); None: not measured (every region).
    """
    compute_s_per_ray: float
    global_rays: int
    grad_bytes: float = 0.0
    exposed_fraction: float = 1.0
    exchange_bytes_per_ray_region: float = 0.0
    render_s_per_ray: float = 0.0
    fusion_s_per_ray_region: float = 0.0
    render_rays: int = 0
    rays_per_rank: int = 0
    device: str = "measured: one rank of the study's world-size-1 cell on this machine"
    regions_crossed: float | None = None  # c_K: mean regions a ray crosses at measured_regions (None: not measured)
    measured_regions: int = 0             # K of that measurement
    fixed_s_per_step: float = 0.0         # compute per step that does not grow with the rays (same device)


def fit_compute(rays: list[float], seconds: list[float]) -> tuple[float, float]:
    """Least-squares line ``seconds = fixed + rays * per_ray`` through measured compute times of
    one device at several batch sizes.

    Args:
        rays: rays per rank of each measurement (at least one).
        seconds: that measurement's compute seconds per step (forward, backward, optimizer, ...).
    Returns:
        ``(fixed_s_per_step, s_per_ray)``; ``(0, sum(seconds) / sum(rays))`` (all per ray) when fewer
        than two distinct batch sizes were measured or the line would need a negative fixed time or
        a non-positive slope.
    Raises:
        ValueError: no measurement, or lists of different lengths.
    """
    if not rays or len(rays) != len(seconds):
        raise ValueError(f"fit_compute: {len(rays)} batch sizes and {len(seconds)} times (need >= 1 pair)")
    proportional = (0.0, sum(seconds) / sum(rays))
    if len(set(rays)) < 2:
        return proportional
    n = len(rays)
    mr, ms = sum(rays) / n, sum(seconds) / n
    slope = sum((r - mr) * (t - ms) for r, t in zip(rays, seconds)) / sum((r - mr) ** 2 for r in rays)
    fixed = ms - slope * mr
    return proportional if fixed < 0 or slope <= 0 else (fixed, slope)


def allreduce_s(nbytes: float, n: int, bw: float, lat: float) -> float:
    """Ring all-reduce of ``nbytes`` on ``n`` ranks: 2(n-1)/n * nbytes/bw + 2(n-1) lat (0 for n = 1)."""
    return 0.0 if n <= 1 else 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * lat


def allgather_s(total_bytes: float, n: int, bw: float, lat: float) -> float:
    """Ring all-gather of ``total_bytes`` in all: (n-1)/n * total/bw + (n-1) lat (0 for n = 1)."""
    return 0.0 if n <= 1 else (n - 1) / n * total_bytes / bw + (n - 1) * lat


def crossed_regions(m: Measured, n: int) -> float:
    """Regions a ray crosses at ``n`` regions: ``1 + (c_K - 1) sqrt(n / K)`` from the measured mean c_K at
    K regions (a ray through a 2-D grid of n cells crosses O(sqrt n) of them), at most n; ``n`` when the
    crossings were not measured."""
    if m.regions_crossed is None or not m.measured_regions:
        return float(n)
    return min(float(n), 1.0 + (m.regions_crossed - 1.0) * math.sqrt(n / m.measured_regions))


def predict(m: Measured, n: int, bw: float, lat: float, mode: str = "weak") -> dict:
    """Predicted seconds at ``n`` ranks for one interconnect (``bw`` bytes/s, ``lat`` s).

    Args:
        mode: ``weak`` (``rays_per_rank`` per rank, ``B = r n``) or ``strong`` (``B`` fixed).
    Returns:
        {"ddp": {"step_s", "exposed_comm_s"}, "ss_independent": {...}, "ss_joint": {"step_s",
        "exchange_s"}, "fused_render_s", "single_render_s", "fused_over_single", "rays_per_rank"}.
    Raises:
        ValueError: an unknown ``mode``.
    """
    if mode not in MODES:
        raise ValueError(f"scaling mode {mode!r}: one of {', '.join(MODES)}")
    per_rank = (m.rays_per_rank or m.global_rays) if mode == "weak" else m.global_rays / n
    compute = m.fixed_s_per_step + m.compute_s_per_ray * per_rank
    sync = allreduce_s(0.0, n, bw, lat)  # the step's agreement: a few float64s, latency only
    exposed = m.exposed_fraction * allreduce_s(m.grad_bytes, n, bw, lat)
    exchange = allgather_s(m.exchange_bytes_per_ray_region * per_rank * n * n, n, bw, lat)
    single = m.render_s_per_ray * m.render_rays
    fused = (single / n + m.fusion_s_per_ray_region * m.render_rays * crossed_regions(m, n)
             + allgather_s(m.exchange_bytes_per_ray_region * m.render_rays * n, n, bw, lat))
    return {"world_size": n, "rays_per_rank": per_rank,
            "ddp": {"step_s": compute + exposed + sync, "exposed_comm_s": exposed, "compute_s": compute},
            "ss_independent": {"step_s": compute + sync, "compute_s": compute},
            "ss_joint": {"step_s": compute + exchange + sync, "exchange_s": exchange, "compute_s": compute},
            "single_render_s": single, "fused_render_s": fused,
            "fused_over_single": fused / single if single > 0 else None}


def scaling_table(m: Measured, world_sizes=WORLD_SIZES, interconnects=INTERCONNECTS, mode: str = "weak") -> dict:
    """Predictions for every interconnect and world size (NVLink only up to 8 ranks; strong
    scaling only while a rank keeps at least :data:`MIN_RAYS_PER_RANK` rays)."""
    out = {}
    for name, ic in interconnects.items():
        sizes = [n for n in world_sizes if (name != "nvlink" or n <= 8)
                 and (mode != "strong" or m.global_rays / n >= MIN_RAYS_PER_RANK)]
        out[name] = [predict(m, n, ic["bw"], ic["lat"], mode) for n in sizes]
    return {"inputs": asdict(m), "mode": mode, "interconnects": interconnects, "assumptions": ASSUMPTIONS,
            "predictions": out}


def check_against(m: Measured, measured: list[dict], bw: float, lat: float, tolerance: float) -> list[dict]:
    """The model at the measured world sizes against the measured medians.

    Args:
        measured: rows ``{"strategy": "ddp"|"ss_independent"|"ss_joint", "world_size", "step_s",
            "compute_scale", "global_rays"}``; ``global_rays``: the cell's rays per step (absent: the
            model's ``global_rays``), ``B / N`` per rank; ``compute_scale`` multiplies the compute term (a rank with fewer
            threads than the device of ``compute_s_per_ray``: the ratio of their compute speeds).
        bw, lat: the measuring machine's collective bandwidth and latency.
        tolerance: allowed relative error.
    Returns:
        rows with ``predicted_s``, ``relative_error`` and ``within`` (bool).
    """
    out = []
    for row in measured:
        scale = row.get("compute_scale", 1.0)
        scaled = Measured(**{**asdict(m), "compute_s_per_ray": m.compute_s_per_ray * scale,
                             "fixed_s_per_step": m.fixed_s_per_step * scale,
                             "global_rays": row.get("global_rays") or m.global_rays})
        # the cell's own global batch B over its ranks (B / N each): what it measured
        pred = predict(scaled, row["world_size"], bw, lat, "strong")[row["strategy"]]["step_s"]
        err = (pred - row["step_s"]) / row["step_s"]
        out.append({**row, "predicted_s": pred, "relative_error": err, "within": abs(err) <= tolerance,
                    "tolerance": tolerance})
    return out
