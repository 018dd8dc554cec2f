"""Config schemas: one dataclass per Hydra config group option, the only place a default is written.

(Over 500 lines on purpose: every key of every group with its default and its meaning (``help``, one line
first), in one file, so that a default is written once and the entry points' --help reads the meanings from
here. Measurements belong on the bench pages, not in a key's help.)

Hydra composes ``conf/train.yaml``; every group file there (``conf/model/grid.yaml``, ...)
starts from the schema declared here (``defaults: [schema_grid]``; registered with Hydra by
:mod:`distnerf.config_check`) and holds only what that option changes. The code reads the validated config (``cfg.model.step_ratio``) and
never restates a default; a new key is added here, with its ``help``, and nowhere else.

Every field is declared with its default, its meaning and, where it has them, its allowed values:
:func:`choice`, :func:`bounded`, :func:`positive`, :func:`items`, :func:`doc`. What checks them, registers
these schemas with Hydra and builds a component's validated section: :mod:`distnerf.config_check`.

Units and conventions: distances in world units (or NDC units for LLFF), times in
seconds unless the key says minutes, colours RGB in [0, 1].
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from omegaconf import MISSING

# the box keys are lists of two [x, y, z] rows, typed List[Any] (OmegaConf cannot convert the
# ints of `[[-2,-2,-1],[2,2,1]]` inside nested float lists); their loaders check the shape


DEFAULT_MAX_STEPS = 1000
"""``train.max_steps`` when it is null and no time budget is set (the README main job's length)."""

DEFAULT_RAYS_PER_RANK = 4096
"""``train.rays_per_rank`` when it and ``train.global_rays`` are both null (the README main job's batch at one
rank). Null, not 4096, is the key's default so that setting ``train.global_rays`` alone is not setting both, and
a run directory's saved config from before the key (``global_rays: 4096``) still validates and means the same."""


def choice(*allowed, help: str = ""):
    """A field whose value must be one of ``allowed`` (checked by :func:`distnerf.config_check.validate`); the first is
    the default. ``help``: its meaning, one line first (``--help`` shows the first sentence)."""
    return field(default=allowed[0], metadata={"choices": tuple(allowed), "help": help})


def bounded(default, low=None, high=None, *, low_open: bool = False, help: str = ""):
    """A numeric field in ``[low, high]`` (``(low, high]`` with ``low_open``; None: unbounded)."""
    return field(default=default, metadata={"low": low, "high": high, "low_open": low_open, "help": help})


def positive(default, help: str = ""):
    return bounded(default, 0, low_open=True, help=help)


def items(default, help: str = ""):
    """A list field (a fresh copy per instance)."""
    return field(default_factory=lambda: list(default), metadata={"help": help})


def doc(default, help: str):
    """A field with a default and no bounds, and its meaning (``--help``)."""
    return field(default=default, metadata={"help": help})


# ----------------------------------------------------------------------------- dataset
@dataclass
class DatasetConfig:
    name: str = MISSING
    background: List[float] = items([1.0, 1.0, 1.0], help="RGB behind the scene, in [0, 1]")


@dataclass
class SyntheticDataset(DatasetConfig):
    """The built-in procedural scene (generated on first use into ``cache_dir``; no download)."""
    name: str = "synthetic"
    kind: str = choice("objects", "detail", "city_small", "city", help=(
        "detail: smooth texture everywhere (capacity-bound); city_small / city: aerial, for spatial segmentation"))
    resolution: Optional[int] = positive(None, help=(
        "image width, pixels (objects, detail: square; cities: height 3/4 of it); null: the kind's "
        "(synthetic/scenes.py DEFAULT_RESOLUTION)"))
    appearance_jitter: bool = doc(True, "cities: per-image exposure and white balance (ignored by objects, detail)")
    downscale: int = positive(1)
    cache_dir: str = ".cache/synthetic"
    near: Optional[float] = doc(None, "null: the scene's own bounds")
    far: Optional[float] = None
    aabb: Optional[List[Any]] = doc(None, "[[x,y,z],[x,y,z]]; null: the scene's")


@dataclass
class BlenderDataset(DatasetConfig):
    """nerf_synthetic layout: ``transforms_{train,val,test}.json`` + RGBA PNGs."""
    name: str = "blender"
    root: str = MISSING
    downscale: int = positive(1)
    near: Optional[float] = doc(None, "null: JSON \"near\" or 2")
    far: Optional[float] = doc(None, "null: JSON \"far\" or 6")
    aabb: Optional[List[Any]] = doc(None, "null: JSON \"aabb\" or [-1.5]*3..[1.5]*3")


@dataclass
class LLFFDataset(DatasetConfig):
    """LLFF forward-facing: ``poses_bounds.npy`` + ``images_<factor>/``; every ``holdout``-th image is a test view."""
    name: str = "llff"
    root: str = MISSING
    factor: int = positive(8)
    holdout: int = positive(8)
    ndc: bool = True
    background: List[float] = items([0.0, 0.0, 0.0])
    near: Optional[float] = None
    far: Optional[float] = None
    aabb: Optional[List[Any]] = None


@dataclass
class CaptureDataset(DatasetConfig):
    """Keys shared by the importers of real captures (COLMAP, nerfstudio); see distnerf/data/normalize.py."""
    root: str = MISSING
    downscale: int = positive(1, help="images_<downscale>/ when present, else images shrunk by it")
    holdout: int = positive(8, help="without split lists: test = sorted-by-name images 0, holdout, 2*holdout...")
    normalize: bool = doc(True, "+Y up, content centred, robust extent 1 (SceneData.transform records it)")
    orient: str = choice("vertical", "up", "none", help=(
        "up axis: normal of the cameras' right vectors (aerial too) / their mean up vector (nerfstudio's \"up\")"))
    background: List[float] = items([0.0, 0.0, 0.0])
    near: Optional[float] = doc(None, "null: per camera, from the sparse points it sees (no points: from the")
    far: Optional[float] = doc(None, "ball converging cameras frame, else from the scene box)")
    aabb: Optional[List[Any]] = doc(None, (
        "null: robust box of the sparse points + margin (no points: the framed ball's cube, else [-1, 1]^3)"))


@dataclass
class ColmapDataset(CaptureDataset):
    """COLMAP sparse model (``sparse/0/`` or ``sparse/``, binary or text) + ``images/``; read with pycolmap."""
    name: str = "colmap"
    images: str = doc("images", "image folder under root (the model's image names are relative to it)")
    test_list: Optional[str] = doc(None, "text file of test image names, one a line; null: every holdout-th")
    val_list: Optional[str] = doc(None, "null: val = test")
    strict: bool = doc(False, "images on disk but not in the model: error instead of a log line")
    min_points: int = positive(16, help="fewer observed points: the image gets the scene's near/far")


@dataclass
class NerfstudioDataset(CaptureDataset):
    """nerfstudio ``transforms.json`` (``root``: its folder or the file); split from its *_filenames lists."""
    name: str = "nerfstudio"


# ----------------------------------------------------------------------------- model
@dataclass
class ModelConfig:
    name: str = MISSING
    compile: bool = doc(False, "torch.compile the model in place (compile time reported apart)")
    compile_mode: Optional[str] = doc(None, "passed to torch.compile, e.g. max-autotune, reduce-overhead")
    max_params: Optional[int] = positive(None, help=(
        "parameters per rank at the final stage (grid: the last of `resolutions`, the earlier ones scaled with it; "
        "ngp: the hash table size; ss: split over the rank's regions); null: the configured sizes"))
    appearance: str = choice("none", "embedding", "affine", help=(
        "per-training-image appearance (model/appearance.py): embedding = NeRF-W's GLO code fed to the colour network"
        " | affine = a per-image 3x3 + bias colour transform (any colour model, SH included)"))
    appearance_dim: int = positive(32, help="embedding: code width D")


@dataclass
class MarchedModelConfig(ModelConfig):
    """The keys of every model rendered by packed ray marching (``grid``, ``ngp``: model/marched.py)."""
    occupancy_threshold: float = bounded(1.0e-3, 0, help="cells below this opacity are skipped")
    color_threshold: float = bounded(1.0e-3, 0, help="a sample with a smaller weight gets no colour (still attenuates)")
    termination: float = bounded(1.0e-4, 0, 1, help="early ray termination below this transmittance")
    eval_round_steps: int = positive(64, help="evaluation marches rays in rounds of this many steps")
    train_round_steps: int = bounded(0, 0, help=(
        "N: training marches in rounds too (no density behind the termination point; 3 host syncs more per round); 0:"
        " one pass"))
    train_termination: bool = doc(False, (
        "with train_round_steps 0: a training render first finds each ray's termination point by a no-grad density "
        "pass over every marched sample and renders only the samples in front of it (true), or renders every marched "
        "sample with gradients (false; the cut keeps most marched samples: bench/throughput/README.md, \"A faster "
        "step\"); evaluation always cuts"))
    distortion_loss_weight: float = bounded(0.0, 0, help=(
        "mip-NeRF 360's distortion loss (Eq. 15) on the weights; 0: off"))
    contraction: str = choice("none", "mipnerf360", help=(
        "mipnerf360: unbounded, the box is the unit region (infinity-norm contraction)"))
    min_altitude: Optional[float] = doc(None, (
        "rays end where they go below this height (+y up, scene units): the ground of an aerial capture, under which "
        "nothing is visible (Mega-NeRF's ray altitude range); null: no floor"))
    floor_footprint: bool = doc(False, (
        "the floor ends rays only where they reach it above the scene box's footprint (x, z inside the box); rays "
        "reaching it past the box's edge go on (the contracted shell paints the ground beyond the box)"))
    opaque_floor: bool = doc(False, (
        "the floor is opaque: the light a ray has left when the floor ends it takes the colour field's value at the "
        "floor point instead of the background's (an aerial capture's ground hides what is under it); with "
        "min_altitude"))
    random_background: bool = doc(False, (
        "training renders each ray over a random background colour (Instant-NGP's trick): for opaque captures (no "
        "alpha: every pixel sees something), where a ray that is not absorbed must not fit; not with alpha targets "
        "composited on dataset.background (Blender), and not in ss joint training's compositing"))


@dataclass
class GridModelConfig(MarchedModelConfig):
    """Voxel grid (DVGO / Plenoxels style): the CPU-practical default on every machine."""
    name: str = "grid"
    resolutions: List[int] = items([64, 128, 160], help="vertices per axis, coarse to fine")
    upsample_steps: List[int] = items([200, 600], help="training steps of each resolution change")
    num_features: int = positive(12)
    hidden_width: int = positive(64)
    viewdir_frequencies: int = bounded(4, 0)
    viewdir_encoding: str = choice("frequency", "sh", help=(
        "the mlp head's view-direction encoding: frequency (NeRF's sinusoids, viewdir_frequencies) | sh (the real "
        "spherical-harmonic basis of degree sh_degree, Instant-NGP's); color=sh reads neither"))
    step_ratio: float = positive(0.5, help="march step = this x the smallest voxel edge")
    alpha_init: float = bounded(1.0e-3, 0, 1, low_open=True)
    density_activation: str = choice("softplus", "trunc_exp", help=(
        "raw table value -> density: softplus (DVGO's shifted softplus) | trunc_exp (Instant-NGP's exp, its gradient's "
        "exponent clamped to [-15, 15]); either is shifted so one step starts at opacity alpha_init"))
    occupancy_every: int = positive(8, help="training steps between occupancy refreshes")
    occupancy_threshold_final: Optional[float] = bounded(None, 0, 1, help=(
        "at the final resolution (the last of `resolutions`, with two or more), cells below this opacity are skipped "
        "instead of occupancy_threshold: the semi-transparent fog the coarse stages grow in free air is pruned once "
        "the surfaces have formed (Instant-NGP's threshold of 0.01); null: occupancy_threshold at every stage"))
    tv_weight: float = bounded(1.0e-5, 0)
    tighten_aabb: bool = True
    color: str = choice("sh", "mlp", help="sh: spherical-harmonic colour grid | mlp: features + tiny MLP")
    sh_degree: int = bounded(1, 0, 2, help="the SH basis stops at degree 2 (model/grid_color.py)")
    shell_alpha_init: bool = doc(False, (
        "contracted (model.contraction): one marching step starts at opacity alpha_init in the shell too (the initial"
        " density divided by the shell's world length per step), instead of r^2 times as opaque there"))
    sparse_grad: bool = doc(True, "sparse colour-row gradients + lazy Adam (off under ddp, W > 1)")
    cubic_voxels: bool = doc(False, (
        "equal voxel edges on every axis: a table over a box that is not a cube (an ss region, an aerial scene) gets "
        "about N^3 vertices spread in proportion to its sides, instead of N per axis (voxels as long as the box's "
        "sides / (N - 1))"))
    lattice_multiple: Optional[List[int]] = doc(None, (
        "[kx, ky, kz]: each axis' voxel count rounded up to a multiple of k (the planes cutting the box into k equal "
        "parts are vertex planes); strategy=ss's sharded joint model sets it to the split counts, and a one-model "
        "control on the same lattice sets it alike; null: no rounding"))


@dataclass
class NeRFModelConfig(ModelConfig):
    """The original NeRF: positional encoding, 8x256 MLP with a skip, coarse + fine samples."""
    name: str = "nerf"
    num_coarse: int = positive(64)
    num_fine: int = bounded(128, 0)
    width: int = positive(256)
    depth: int = positive(8)
    pos_frequencies: int = bounded(10, 0)
    dir_frequencies: int = bounded(4, 0)


@dataclass
class NGPModelConfig(MarchedModelConfig):
    """Instant-NGP style multiresolution hash grid, pure PyTorch."""
    name: str = "ngp"
    num_levels: int = positive(16)
    features_per_level: int = positive(2)
    log2_table_size: int = bounded(17, 4, 30)
    base_resolution: int = positive(16)
    max_resolution: int = positive(1024)
    hidden_width: int = positive(64)
    num_steps: int = positive(512, help="march steps across the scene box's diagonal")
    occupancy_resolution: int = positive(64)
    occupancy_every: int = positive(16)


# ----------------------------------------------------------------------------- strategy
@dataclass
class StrategyConfig:
    name: str = MISSING


@dataclass
class DDPStrategyConfig(StrategyConfig):
    """Data parallel: the whole model per rank, gradients all-reduced (world size 1: one process)."""
    name: str = "ddp"
    bucket_cap_mb: float = positive(25.0)
    find_unused_parameters: bool = False
    gradient_as_bucket_view: bool = True
    compression: str = choice("none", "fp16", "bf16", help="dtype gradients travel in")
    sparse_min_numel: Optional[int] = doc(1_000_000, "buckets this large travel as (index, value) pairs; null: dense")
    sparse_max_density: float = bounded(0.02, 0, 1, help=(
        "... when at most this share of their entries is non-zero: the measured crossover (bench/scaling/exchange.md, "
        "\"Exchange crossover\")"))
    sparse_mode: str = choice("auto", "counted", "bounded", help="auto: counted on CPU, bounded (no host sync) on CUDA")
    sparse_tables: bool = doc(False, (
        "the grid's colour-feature tables keep their sparse row gradients (model.sparse_grad, lazy Adam, as one "
        "process) and travel outside DDP's buckets as (row, value) pairs (strategy/sparse_exchange.py "
        "launch_row_exchange); false: every table dense in DDP's buckets (dense Adam). The CPU only: refused on CUDA "
        "(dense gradients there)"))


@dataclass
class SSStrategyConfig(StrategyConfig):
    """Spatial segmentation: one sub-scene model per region, no gradient all-reduce."""
    name: str = "ss"
    partition: str = choice("grid", "balanced", help="grid: ground-plane grid | balanced: k-d split of a density fit")
    num_regions: Optional[int] = doc(None, "null: the world size; else a multiple of it")
    grid: Optional[List[int]] = doc(None, "cells per axis [nx, ny, nz] (product = num_regions); null: longest axes")
    overlap: float = bounded(0.15, 0, help="enlarge each region by this fraction of its size per side")
    context_resolution: int = positive(32, help="grid sub-models: vertices per axis outside the region")
    balance_steps: int = positive(100, help="balanced: steps of the coarse density fit")
    balance_resolution: int = positive(32)
    balance_rays: int = positive(2048)
    training: str = choice("independent", "joint", help="joint: exact compositing (NeRF-XL style)")
    joint_exchange: str = choice("gather", "route", help=(
        "joint training's exchange: gather = every rank draws the same global batch, renders its regions' segments of"
        " all of it and all-gathers them (bytes per rank grow with W x the batch); route = each rank draws its own "
        "rays_per_rank and sends each ray only to the ranks whose regions it crosses (all-to-all; grid/ngp models)"))
    joint_model: str = choice("auto", "sharded", "per_region", help=(
        "joint training's sub-models: sharded = one model's contraction, lattice and sample spacing, each region "
        "holding its slice (grid with color=sh; regions cut through the scene box's centre planes when contracted) "
        "and one appearance applied to the composite | per_region = each region its own model (own box, contraction "
        "and lattice, as Mega-NeRF) | auto = sharded where the model allows it, else per_region"))
    fusion: str = choice("segment", "blend", help="evaluation: exact segment compositing | blend")
    color_threshold: float = bounded(1.0e-3, 0, help="fusion: segment-local weight below which no colour")
    blend_power: float = positive(2.0, help="blend: inverse-distance weight exponent")


# ----------------------------------------------------------------------------- sampler
@dataclass
class SamplerConfig:
    """Ray batches; every kind draws bitwise the same batches (a performance setting)."""
    name: str = choice("auto", "pipelined", "sync", "device", help="auto: device on CUDA (pixels fit), else pipelined")
    policy: str = choice("uniform", "per_image", help="uniform over all pixels | a few images per step")
    images_per_step: int = positive(4, help="policy=per_image")
    filter: Optional[Any] = doc(None, "e.g. {kind: box, aabb: [[-1,-1,-1],[1,1,1]]}: rays missing it are invalid")
    source: str = choice("memory", "files", help="files: each batch decodes the images it draws")
    cache_dir: Optional[str] = doc(None, "decoded pixels memory-mapped there (built once, shared)")
    num_workers: int = positive(2, help="pipelined: worker processes per rank")
    prefetch: int = positive(4, help="pipelined: batches built ahead")
    start_method: str = choice("forkserver", "spawn")
    timeout_s: float = positive(300.0, help="longest wait for one batch from a live worker")
    max_device_fraction: float = bounded(0.5, 0, 1, low_open=True, help="device: share of free device memory")
    fallback: str = choice("pipelined", "sync", help="device: used when the pixels do not fit")


# ----------------------------------------------------------------------------- logger, profiler
@dataclass
class WandbConfig:
    mode: str = choice("offline", "online", "disabled")
    project: str = "distnerf"
    name: Optional[str] = doc(None, "null: the run directory's name")
    id: Optional[str] = doc(None, "null: stable per run directory (restarts continue one run)")
    group: Optional[str] = doc(None, (
        "W&B run group; null: the strategy (ddp, ss_independent, ss_joint); studies: study-<name>"))
    job_type: Optional[str] = doc(None, "null: train; studies: the cell's strategy")
    log_images: bool = doc(True, "validation and test panels (ground truth | prediction | depth), rank 0")


@dataclass
class LoggerConfig:
    level: str = choice("INFO", "DEBUG", "WARNING", "ERROR")
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class TraceConfig:
    """torch.profiler schedule (``profiler=trace``)."""
    wait: int = bounded(2, 0, help="steps skipped after start")
    warmup: int = bounded(1, 0, help="steps profiled but discarded")
    active: int = positive(3, help="steps recorded")
    repeat: int = bounded(1, 0, help="cycles (0: until the end)")
    record_shapes: bool = True
    profile_memory: bool = True
    with_stack: bool = False
    top_ops: int = positive(30, help="operators by self time kept in ops_rank_K.json")


@dataclass
class ProfilerConfig:
    name: str = "default"
    breakdown: bool = doc(True, "per-step phase timing (RUN/profile/rank_K.json)")
    skip_steps: int = bounded(2, 0, help="leading steps left out of the steady-state summary")
    max_step_records: int = bounded(20_000, 4, help="step records kept in memory (past it: a systematic sample)")
    nvtx: bool = doc(False, "NVTX ranges per phase (CUDA only)")
    telemetry: bool = doc(True, "NVML + process CPU/RSS samples")
    telemetry_interval_s: float = positive(1.0)
    trace: Optional[TraceConfig] = None


# ----------------------------------------------------------------------------- train, eval, root
@dataclass
class TrainLoopConfig:
    """``train``: the batch and how long training runs."""
    # the batch: per rank by default (weak scaling: the global batch is world size x rays_per_rank, the lr
    # unchanged); global_rays: a fixed global batch split over the ranks (strong scaling). Setting both is an
    # error. Joint ss: the global batch is drawn once (a shared stream) and every ray rendered by the regions it
    # crosses (config_check.global_batch, strategy.rays_per_rank)
    rays_per_rank: Optional[int] = positive(None, help=(
        "rays per step per rank; null: DEFAULT_RAYS_PER_RANK (4096) unless global_rays is set, or 16384 where the "
        "static step runs by default (CUDA: sample_budget.py)"))
    global_rays: Optional[int] = positive(None, help=(
        "rays per step over all ranks, divided by the world size; null: rays_per_rank x world size"))
    max_steps: Optional[int] = positive(None, help=(
        "null: 1000 steps without a time budget, no step limit with one (the budget stops the run)"))
    max_minutes: float = bounded(0.0, 0, help="training-time budget (evaluation excluded); 0: none")


@dataclass
class OptimConfig:
    """``optim``: Adam and the learning-rate and grid-stage schedules."""
    lr: float = positive(1.0e-3, help="base lr; models scale it per parameter group")
    betas: List[float] = items([0.9, 0.999])
    eps: float = positive(1.0e-15)
    fused: bool = doc(True, "fused Adam kernel")
    decay: float = bounded(0.1, 0, 1, low_open=True, help=(
        "Schedules (the rule, once: distnerf/components/schedule.py). No time budget (train.max_minutes 0): by step, "
        "lr = lr * decay ** (step / decay_steps) (decay_steps null: the rule below with p = step / train.max_steps), "
        "grid stages at model.upsample_steps. With train.max_minutes > 0: by p = the fraction of the budget elapsed "
        "(agreed across ranks, saved in checkpoints): lr = lr * decay ** (max(p - decay_start, 0) / (1 - "
        "decay_start)); grid stages at their steps (or, with schedule_steps, also at p >= upsample_steps[i] / "
        "schedule_steps, whichever first). Warm-up and occupancy refresh: steps, in both. `python -m distnerf.train "
        "--cfg job --resolve` prints the resolved rule (schedule)."))
    decay_steps: Optional[float] = positive(1500.0, help="null: over the run (p = step / max_steps, the budget's rule)")
    decay_start: float = bounded(0.8, 0, 0.99, help="time budget (or decay_steps null): p where the decay begins")
    warmup_steps: int = bounded(0, 0)
    schedule_steps: Optional[float] = positive(None, help=(
        "null: grid stages by step under a budget too; N: also at p >= upsample_steps[i] / N, whichever first (N: the"
        " run length upsample_steps are written for)"))
    schedule: str = doc("${distnerf_schedule:}", "read-only: the resolved rule (config_check.describe_schedule)")


@dataclass
class StepConfig:
    """``step``: which training step runs and how (the step path: distnerf/components/step_path.py)."""
    samples_per_step: Optional[int] = bounded(None, 0, help=(
        "static sync-free step (distnerf/components/sample_budget.py): P fixed sample slots a step, the rays marched "
        "adapt inside the rank's batch (train.rays_per_rank); 0: off (the dynamic step); null: auto, 262144 (2^18, as"
        " Instant-NGP / nerfacc) on CUDA for a model the static step covers, else 0 (the CPU keeps the dynamic step)."
        " With both batch keys null the static step's batch is 16384 rays per rank"))
    cuda_graph: bool = doc(False, (
        "the whole static step (render, loss, backward, regulariser, optimizer) recorded once per grid stage and "
        "replayed as one CUDA graph (distnerf/components/graphed_step.py): one process, the static step, "
        "model.compile=false, dense gradients; on the CPU the same body runs uncaptured (a check, not faster)"))
    probe_every: int = bounded(100, 0, help="cuda_graph: an eager step every N steps for the phase breakdown (0: none)")
    bf16: bool = doc(False, "bf16 autocast of the training render (CUDA; the CPU's autocast too)")
    deterministic: bool = doc(False, (
        "torch.use_deterministic_algorithms: CUDA's scatter_add_/index_add_ take their deterministic kernels "
        "(slower), an op without one raises"))


@dataclass
class CheckpointsConfig:
    """``checkpoints``: when the run saves, and how many it keeps."""
    every: int = bounded(500, -1, help="steps between checkpoints; 0: only a final one; -1: none")
    every_minutes: float = bounded(0.0, 0, help="a checkpoint every this many minutes of training time (0: off)")
    at_minutes: List[float] = items([], help="extra checkpoints at these training-time marks (minutes)")
    keep: int = positive(2, help="committed checkpoints kept (the newest)")
    background: bool = doc(True, "periodic checkpoints: a host copy, then written and committed in the background")


@dataclass
class MonitorConfig:
    """``monitor``: what a run reports while it trains (logs, validation, the progress line)."""
    log_every: int = positive(50, help="steps between metric logs")
    val_every: int = bounded(0, 0, help="steps between validations (0: off)")
    val_views: int = positive(2, help="views rendered by each validation")
    progress: bool = doc(True, "the main rank's progress line")


@dataclass
class EvalConfig:
    enabled: bool = True
    num_views: Optional[int] = doc(None, "null: every test view; N: N evenly spaced views")
    downscale: int = positive(1)
    chunk: int = positive(16384, help=(
        "rays rendered at once (16384 against 8192: bench/quality/lego.md)"))
    point_chunk: int = bounded(262144, 0, help=(
        "points per network call of no-grad evaluation (nerf: every MLP call; 0: no limit): bounds evaluation's "
        "memory (bench/memory/README.md)"))
    lpips: bool = True
    appearance: str = choice("mean", "fit_left_half", help=(
        "test views of a model with model.appearance (never indexed by a test id): mean = the mean training code | "
        "fit_left_half = NeRF-W's protocol: a code fitted on each view's left half (weights frozen), PSNR/SSIM/LPIPS "
        "on its right half"))
    appearance_steps: int = positive(64, help="fit_left_half: Adam steps per view")
    appearance_rays: int = positive(4096, help="fit_left_half: left-half rays per step (seeded per view)")
    appearance_lr: float = positive(1.0e-2, help="fit_left_half: Adam learning rate of the code")
    fusion_timing: bool = doc(False, (
        "ss: time the fusion stage's phases (routing, exchange + compositing) on CUDA too, where each is a device "
        "synchronisation (about 4 per chunk); off: metrics.json's fusion_timing is null there. The CPU always times "
        "them (free)"))


@dataclass
class ViewerConfig:
    """The web viewer (``python -m distnerf.view``; ``viewer.enabled=true`` on training: live, rank 0)."""
    enabled: bool = doc(False, "training serves the viewer from rank 0, rendering the current model")
    port: int = bounded(7007, 1, 65535, help="HTTP/websocket port (viser); forward it with ssh -L 7007:localhost:7007")
    host: str = doc("127.0.0.1", (
        "address served on: loopback only (reach it through ssh -L); another (0.0.0.0: every interface) serves "
        "renders and training images to anyone who reaches it, without authentication (logged as a warning)"))
    max_render_share: float = bounded(0.08, 0, 1, low_open=True, help=(
        "live: rendering takes at most this share of wall time (training keeps >= 1 - share; nerfstudio's is 0.15; "
        "the cost of watching: bench/throughput/README.md)"))
    max_resolution: int = positive(512, help="longest image side of a still frame (moving: lower, by render speed)")


@dataclass
class TrainConfig:
    """The root of ``conf/train.yaml``."""
    dataset: Any = MISSING
    model: Any = MISSING
    strategy: Any = MISSING
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    step: StepConfig = field(default_factory=StepConfig)
    checkpoints: CheckpointsConfig = field(default_factory=CheckpointsConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    viewer: ViewerConfig = field(default_factory=ViewerConfig)
    run_dir: Optional[str] = doc(None, "one directory for all ranks; null: runs/<timestamp> chosen by rank 0")
    resume: bool = doc(False, "continue from the newest committed checkpoint in run_dir")
    seed: int = 0
    device: str = choice("auto", "cpu", "cuda", help="the backend follows: nccl on CUDA, gloo on CPU")
    num_threads: Optional[int] = positive(None, help=(
        "compute threads per rank; null: OMP_NUM_THREADS if set, else the usable cores (affinity, cgroup quota) / "
        "local ranks (distnerf/cpu.py)"))
    dist_timeout_s: float = positive(600.0, help="collective timeout of the training steps")
    dist_setup_timeout_s: float = positive(7200.0, help=(
        "rendezvous and collectives before the first step (decoding, caches, the partition's fit); a monitored "
        "barrier ends it"))
    dist_progress_s: float = positive(5.0, help="each rank publishes its step and phase this often (hang reports)")
    dist_backend: str = choice("auto", "gloo", help=(
        "auto: nccl for CUDA tensors (gloo for host values), gloo on CPU; gloo: gloo for CUDA tensors too, so ranks "
        "may share a GPU (a check of the multi-rank code on one GPU, not a way to train)"))


@dataclass
class RenderConfig(TrainConfig):
    """A run's saved config plus the keys of ``python -m distnerf.render`` / ``distnerf.export``."""
    checkpoint: Optional[str] = doc(None, "RUN/checkpoints/step_N; null: the newest committed")
    weights: Optional[str] = doc(None, "a file written by distnerf.export")
    fusion: Optional[str] = doc(None, "ss runs: segment | blend; null: the run's strategy.fusion")
    out_dir: Optional[str] = doc(None, "null: RUN/render")
    video: Optional[str] = doc(None, (
        "a fly-through along the training cameras into this file (.gif; .mp4 etc. with imageio-ffmpeg installed, else"
        " the .gif beside it); null: none"))
    orbit: bool = doc(False, "an orbit GIF about world +Y too (RENDER/orbit.gif; object-centred scenes)")
    video_frames: int = positive(60, help="frames of the fly-through and of the orbit")
    video_fps: float = positive(24.0, help="frames per second of both")
    out: Optional[str] = doc(None, "export: output file; null: RUN/export/...")
    format: str = choice("weights", "ply", "mesh", help=(
        "export: weights (a .pt for render weights=) | ply (coloured point cloud) | mesh (marching cubes, vertex "
        "colours), both PLY in the capture's frame"))
    lattice: int = bounded(256, 2, help="export ply/mesh: lattice vertices per axis over the scene box")
    threshold: float = positive(10.0, help=(
        "export ply/mesh: density (1 / scene unit) of the surface and the points kept"))


# ----------------------------------------------------------------------------- study
@dataclass
class StudyLoadConfig:
    """Waiting for a quiet machine before each timed cell."""
    max_load: Optional[float] = positive(None, help="start a timed cell once the load is below this; null: never wait")
    measure: str = choice("instant", "loadavg", help=(
        "instant: busy cores over sample_s (/proc/stat) | loadavg: the 1-minute load average (decays for minutes "
        "after a cell)"))
    sample_s: float = positive(2.0)
    wait_s: float = bounded(900.0, 0, help="longest wait; past it the cell starts and is marked contended")
    poll_s: float = positive(5.0)


@dataclass
class StudySlurmConfig:
    """``launcher: slurm``: one ``launch/slurm_train.sbatch`` job per cell."""
    options: List[str] = items([], help="extra sbatch options, e.g. [--partition=gpu, --time=01:00:00]")
    gpus_per_rank: int = bounded(0, 0, help="0: CPU ranks (--cpus-per-task from `threads`)")
    poll_s: float = positive(2.0)


@dataclass
class StudyConfig:
    """A study (``conf/study/*.yaml``, run by ``python -m distnerf.study``): a matrix of training runs.

    ``axes`` lists the values of each axis (the axes: ``distnerf.study.plan.AXES``); ``levels``
    says what a value means as training overrides (built-in levels: ``plan.BUILTIN_LEVELS``). Every cell is the
    product's, unless ``cells`` lists the ones wanted (partial {axis: value} matches) or
    ``exclude`` removes some.
    """
    name: str = MISSING
    description: str = ""
    fixed: List[str] = items([], help="training overrides of every cell")
    axes: Optional[Any] = doc(None, "{axis: [values]} (required)")
    levels: Optional[Any] = doc(None, "{axis: {value: [overrides]}}")
    cells: Optional[List[Any]] = doc(None, "null: every cell of the product")
    exclude: List[Any] = items([])
    repeats: int = positive(1, help="timed cells: repeats interleaved (r0 of every cell, then r1...)")
    vary_seed: bool = doc(True, (
        "repeat r trains with seed=seed+r (ray streams and jitter; model=grid's sh head starts the same): quality "
        "over repeats is a sample, not n = 1 copies; false: one seed"))
    seed: int = doc(0, "the seed of repeat 0")
    timed: bool = doc(True, "wait for a quiet machine before each cell (see load)")
    threads: Optional[int] = positive(None, help="OMP threads per rank; null: CPU count // world size")
    cell_timeout_s: float = positive(7200.0, help="a cell running longer is stopped and failed")
    launcher: str = choice("local", "slurm")
    load: StudyLoadConfig = field(default_factory=StudyLoadConfig)
    slurm: StudySlurmConfig = field(default_factory=StudySlurmConfig)
