"""Worker functions for multi-process gloo tests (spawned by torch.multiprocessing).

Each worker joins a real gloo process group through the same code path as
``torchrun`` (``RANK``/``WORLD_SIZE``/``MASTER_*`` in the environment) and writes
its results to ``out_dir/rank_<r>.pt`` for the test process to compare.
"""
from __future__ import annotations

import dataclasses
import os
import traceback
from pathlib import Path

import torch

from distnerf import distributed as D
from distnerf.data.rays import RayBundle
from distnerf.components.loss import photometric_sse
from distnerf.components.step_path import use_dense_gradients
from distnerf.model.grid import GridModel
from distnerf.schema import TrainConfig
from distnerf.strategy.ddp import DDPStrategy


def set_env(rank: int, world_size: int, port: int) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})


def make_problem(num_rays: int = 64, seed: int = 0):
    """Rays aimed at the unit box from a sphere of radius 3, random targets (float64)."""
    g = torch.Generator().manual_seed(seed)
    origins = torch.randn(num_rays, 3, generator=g, dtype=torch.float64)
    origins = 3.0 * origins / origins.norm(dim=-1, keepdim=True)
    target = 0.3 * torch.randn(num_rays, 3, generator=g, dtype=torch.float64)
    dirs = target - origins
    dirs = dirs / dirs.norm(dim=-1, keepdim=True)
    rays = RayBundle(origins, dirs, dirs, torch.full((num_rays,), 0.5, dtype=torch.float64),
                     torch.full((num_rays,), 6.0, dtype=torch.float64))
    rgb = torch.rand(num_rays, 3, generator=g, dtype=torch.float64)
    return rays, rgb


def make_model(seed: int = 0) -> GridModel:
    """A small float64 grid model with an MLP head and some density structure."""
    torch.manual_seed(seed)
    aabb = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])
    model = GridModel(aabb, torch.ones(3), resolutions=[12], upsample_steps=[], color="mlp",
                      hidden_width=16, alpha_init=1e-2, tv_weight=0.0, occupancy_threshold=1e-3)
    with torch.no_grad():
        model.density.normal_(-6.0, 4.0)  # mixed empty and occupied space
        model.features.normal_(0, 0.5)
    model.double().eval()  # deterministic sample placement
    return model


def valid_mask(rank: int, n: int) -> torch.Tensor:
    """Unequal valid-ray counts: rank 0 keeps n-2 rays, rank 1 keeps n // 3."""
    keep = n - 2 if rank == 0 else n // 3
    mask = torch.zeros(n, dtype=torch.bool)
    mask[:keep] = True
    return mask


def fix_capacity(model: GridModel, fraction: int) -> None:
    """Give ``model`` a fixed capacity of 1 / ``fraction`` of each table's entries
    (:meth:`~distnerf.model.base.RadianceModel.gradient_entry_capacity`; the grid has one only under a
    static step's sample budget, which this eval-mode float64 model does not run), the same on every
    rank: a half holds every non-zero of this problem (the strategy's check says so), a 64th does not."""
    model.gradient_entry_capacity = lambda: {id(p): p.numel() // fraction for p in model.bounded_parameters()}


def wrap(strategy: DDPStrategy, model: GridModel) -> torch.nn.Module:
    """``strategy.wrap(model)`` with the gradients the trainer's step would give it: dense where the strategy asks
    (:func:`~distnerf.components.step_path.build_step` turns ``model.sparse_grad`` off there)."""
    wrapped = strategy.wrap(model)
    if strategy.dense_gradients():
        use_dense_gradients(model)
    return wrapped


def init_gloo() -> D.DistEnv:
    """This rank's CPU process group, with the schema's ``dist_timeout_s`` throughout (no longer
    set-up timeout: a hung worker fails within it)."""
    return D.init_distributed("cpu", timeout_s=TrainConfig().dist_timeout_s, setup_timeout_s=None)


def grad_worker(rank: int, world_size: int, port: int, out_dir: str, num_rays: int, sgd_steps: int, lr: float,
                strategy_cfg: dict):
    set_env(rank, world_size, port)
    env = init_gloo()
    try:
        rays, rgb = make_problem(num_rays)
        per = num_rays // world_size
        mine = slice(rank * per, (rank + 1) * per)
        rays_r, rgb_r, valid_r = rays.map(lambda t: t[mine]), rgb[mine], valid_mask(rank, per)
        strategy = DDPStrategy(strategy_cfg, env)
        model = make_model()
        if strategy_cfg.get("sparse_mode") == "bounded":
            fix_capacity(model, 2)
        wrapped = wrap(strategy, model)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        grads, params = None, None
        for step in range(sgd_steps + 1):
            out = wrapped(rays_r)
            sse = photometric_sse(out, rgb_r, valid_r)
            # the trainer's path: a fixed divisor, the global count's correction after the backward
            norm = strategy.loss_normalizer(valid_r.sum(), per)
            (sse / norm.divisor).backward()
            strategy.finish_gradients()  # sparse_tables: the rows' exchange
            norm.rescale_(model.parameters())
            if step == 0:
                grads = {k: p.grad.detach().to_dense().clone() for k, p in model.named_parameters()}
                sparse = sorted(k for k, p in model.named_parameters() if p.grad.is_sparse)
            if step < sgd_steps:
                optimizer.step()
                optimizer.zero_grad()
        params = {k: p.detach().clone() for k, p in model.named_parameters()}
        strategy.check_exchange()  # bounded: every non-zero found a slot (raises otherwise)
        model.update_occupancy()
        comm = strategy.comm_stats()
        torch.save({"grads": grads, "params": params, "occupancy": model.occupancy.binary.clone(), "comm": comm,
                    "sparse": sparse},
                   Path(out_dir) / f"rank_{rank}.pt")
    finally:
        strategy = wrapped = None  # the DDP wrapper holds the process group (see D.shutdown)
        D.shutdown(env)


def overflow_worker(rank: int, world_size: int, port: int, out_dir: str, num_rays: int):
    """One bounded-exchange step with a capacity a 64th of each table (a model whose bound is wrong),
    then a rewrap (what grid upsampling does), then the strategy's check: every rank must raise."""
    set_env(rank, world_size, port)
    env = init_gloo()
    result = {}
    try:
        rays, rgb = make_problem(num_rays)
        per = num_rays // world_size
        mine = slice(rank * per, (rank + 1) * per)
        rays_r, rgb_r, valid_r = rays.map(lambda t: t[mine]), rgb[mine], valid_mask(rank, per)
        strategy = DDPStrategy({"name": "ddp", "sparse_min_numel": 0, "sparse_max_density": 1.0,
                                "sparse_mode": "bounded"}, env)
        model = make_model()
        fix_capacity(model, 64)
        wrapped = wrap(strategy, model)
        sse = photometric_sse(wrapped(rays_r), rgb_r, valid_r)
        (sse / per).backward()  # the loss's scale does not matter here
        strategy.rewrap()
        try:
            strategy.check_exchange()
            result["error"] = None
        except RuntimeError as err:
            result["error"] = str(err)
        strategy.check_exchange()  # checked once: nothing pending now, no raise
    except Exception:  # noqa: BLE001 - reported to the test
        result["traceback"] = traceback.format_exc()
    finally:
        torch.save(result, Path(out_dir) / f"overflow_rank_{rank}.pt")
        strategy = wrapped = None  # the DDP wrapper holds the process group (see D.shutdown)
        D.shutdown(env)


def compose_config(overrides: list[str]):
    """The real Hydra config of ``conf/train.yaml`` with ``overrides``, validated (as the entry point does)."""
    from hydra import compose, initialize_config_dir

    from distnerf.config_check import validate

    conf = Path(__file__).resolve().parents[2] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return validate(compose("train", overrides=overrides))


def trainer_worker(rank: int, world_size: int, port: int, run_dir: str, overrides: list, mode: str):
    """Runs the real Trainer (the strategy of ``overrides``) on the built-in scene; ``mode`` injects
    rank-local stop causes: ``nan``, a non-finite loss on rank 1 at step 2; ``budget_nan``, a tiny
    time budget on rank 1 and a non-finite loss on rank 0 at step 1."""
    from distnerf.components import step as step_mod
    from distnerf.engine import trainer as trainer_mod
    from distnerf.strategy import build_strategy

    set_env(rank, world_size, port)
    result = {"rank": rank}
    env = init_gloo()
    try:
        cfg = compose_config(overrides + [f"run_dir={run_dir}"])
        if rank == 1 and mode == "budget_nan":
            cfg.train.max_minutes = 1e-9
        poisoned_step = {("nan", 1): 2, ("budget_nan", 0): 1}.get((mode, rank))
        if poisoned_step is not None:
            calls = {"n": 0}
            real = step_mod.ray_error

            def poisoned(*args, **kwargs):
                calls["n"] += 1
                error = real(*args, **kwargs)
                return dataclasses.replace(error, sse=error.sse * float("nan")) if calls["n"] == poisoned_step + 1 else error

            step_mod.ray_error = poisoned
        trainer = trainer_mod.Trainer(cfg, build_strategy(cfg.strategy, env), Path(run_dir))
        try:
            out = trainer.fit()
            result.update(step=out["step"], stop_reason=out["stop_reason"])
        except trainer_mod.NonFiniteLoss as err:
            result.update(step=trainer.step, error=str(err))
    except Exception:  # noqa: BLE001 - reported to the test
        result["traceback"] = traceback.format_exc()
    finally:
        trainer = None  # its DDP wrapper holds the process group (see D.shutdown)
        if D.shutdown(env):
            result.setdefault("traceback", "a process group outlived D.shutdown (a wrapper still referenced)")
    torch.save(result, Path(run_dir) / f"result_rank_{rank}.pt")


class WaitRecorder:
    """A collective's work handle that notes, in ``call["waited_in"]``, the trainer's phase when it is waited for."""

    def __init__(self, work, call: dict, timer):
        self.work, self.call, self.timer = work, call, timer

    def wait(self, *args, **kwargs):
        self.call["waited_in"] = self.timer.current
        return self.work.wait(*args, **kwargs)


def counting_worker(rank: int, world_size: int, port: int, run_dir: str, overrides: list):
    """Runs the real Trainer under ``strategy=ddp`` with every torch.distributed collective
    wrapped by a counter (the dist helpers call them through the module), and records the
    calls of each step (from one step's ``profiler.end_step`` to the next: input, forward,
    step agreement, backward with DDP's bucket hook, optimizer, logging), and (``gap``) each one
    called between the forward and the backward: whether it was launched ``async_op`` and the phase
    in which the host waited for it."""
    import torch.distributed as dist

    from distnerf.engine import trainer as trainer_mod
    from distnerf.strategy import build_strategy

    set_env(rank, world_size, port)
    counts = {"calls": 0, "names": []}
    result = {"rank": rank, "per_step": [], "gap": []}
    timer = {}  # the trainer's step timer, once built: which phase a collective is called and waited in
    for name in ("all_reduce", "all_gather", "broadcast", "broadcast_object_list", "all_gather_object", "barrier",
                 "all_gather_into_tensor", "reduce_scatter_tensor"):
        real = getattr(dist, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            counts["calls"] += 1
            counts["names"].append(_name)
            work = _real(*args, **kwargs)
            if "steps" in timer and timer["steps"].current == "forward":  # after the forward, before the backward
                call = {"name": _name, "async": bool(kwargs.get("async_op")), "waited_in": None}
                result["gap"].append(call)
                return WaitRecorder(work, call, timer["steps"]) if work is not None else work
            return work

        setattr(dist, name, counted)
    env = init_gloo()
    try:
        cfg = compose_config(overrides + [f"run_dir={run_dir}"])
        trainer = trainer_mod.Trainer(cfg, build_strategy({"name": "ddp"}, env), Path(run_dir))
        timer["steps"] = trainer.timer
        real_end = trainer.profiler.end_step
        mark = {"at": counts["calls"]}

        def end_step(*args, **kwargs):  # the collectives since the previous step's end: one whole step
            out = real_end(*args, **kwargs)
            result["per_step"].append((counts["calls"] - mark["at"], counts["names"][mark["at"]:]))
            mark["at"] = counts["calls"]
            return out

        trainer.profiler.end_step = end_step
        out = trainer.fit()
        result.update(step=out["step"], wrapped=type(trainer.strategy.wrapped).__name__,
                      comm=trainer.strategy.comm_stats())
    except Exception:  # noqa: BLE001 - reported to the test
        result["traceback"] = traceback.format_exc()
    finally:
        trainer = None  # its DDP wrapper holds the process group (see D.shutdown)
        if D.shutdown(env):
            result.setdefault("traceback", "a process group outlived D.shutdown (a wrapper still referenced)")
    torch.save(result, Path(run_dir) / f"result_rank_{rank}.pt")


def gloo_worker_threads() -> int:
    """This process's gloo worker threads (named ``pt_gloo_runloop`` by torch), from /proc."""
    count = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            count += (task / "comm").read_text().strip() == "pt_gloo_runloop"
        except FileNotFoundError:  # a thread that ended between the listing and the read
            pass
    return count


def shutdown_worker(rank: int, world_size: int, port: int, out_dir: str):
    """A DDP step and an object broadcast (the collectives whose tensors a gloo thread frees), then
    :func:`D.shutdown` twice over: first with the DDP wrapper still referenced, then after dropping it."""
    import gc

    set_env(rank, world_size, port)
    result = {"before": gloo_worker_threads()}
    env = init_gloo()
    strategy = DDPStrategy({"name": "ddp"}, env)
    model = make_model()
    wrapped = wrap(strategy, model)
    rays, rgb = make_problem(8)
    photometric_sse(wrapped(rays), rgb, torch.ones(8, dtype=torch.bool)).backward()
    D.broadcast_object(env, {"step": 1})
    result["running"] = gloo_worker_threads()
    result["alive_while_wrapped"] = D.shutdown(env)
    result["held"] = gloo_worker_threads()
    strategy = wrapped = None
    gc.collect()
    result["after"] = gloo_worker_threads()
    torch.save(result, Path(out_dir) / f"shutdown_rank_{rank}.pt")


class ScaledLinear(torch.nn.Module):
    """``sum(inner(x * scale))``: a parameter at the root (``scale``) and two in a child (``inner``)."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
        self.inner = torch.nn.Linear(3, 2, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x * self.scale).sum()


def kept_out_gradients(rank: int) -> dict[str, torch.Tensor]:
    """:func:`~distnerf.strategy.ddp.keep_out_of_ddp` on the root ``scale`` and the nested ``inner.weight`` of a
    :class:`ScaledLinear`, then one DDP backward whose gradients differ by rank: every parameter's gradient."""
    from distnerf.strategy.ddp import keep_out_of_ddp

    torch.manual_seed(0)  # the same initial parameters on every rank
    model = ScaledLinear()
    keep_out_of_ddp(model, [model.scale, model.inner.weight])
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp(torch.full((4, 3), float(rank + 1), dtype=torch.float64)).mul(rank + 1).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def gloo_cuda_worker(rank: int, world_size: int, port: int) -> None:
    """``dist_backend=gloo`` on CUDA: every rank joins on the one visible GPU (device 0 on a one-GPU
    machine) and the package's device collectives exchange CUDA tensors through gloo."""
    set_env(rank, world_size, port)
    os.environ["LOCAL_WORLD_SIZE"] = str(world_size)
    env = D.init_distributed("cuda", timeout_s=60.0, setup_timeout_s=None, backend="gloo")
    try:
        assert env.backend == "gloo" and env.device == torch.device("cuda", rank % torch.cuda.device_count())
        t = torch.full((5,), float(rank + 1), device=env.device)
        D.all_reduce_(t)
        assert t.device == env.device and t.tolist() == [world_size * (world_size + 1) / 2] * 5, t
        parts = D.all_gather(torch.tensor([rank, 10 * rank], device=env.device))
        assert [p.tolist() for p in parts] == [[r, 10 * r] for r in range(world_size)], parts
        D.barrier(env)
    finally:
        D.shutdown(env)


def async_exchange_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Both sparse exchanges launched while the last rank is still busy (it sleeps 1.5 s before launching its
    own): a rank's launch must return at once with its future pending, and the futures must then hold the
    float64 average of every rank's buffer (the ranks' buffers are seeded by rank: each computes all of them)."""
    import time

    from distnerf.strategy.sparse_exchange import launch_bounded_sparse_allreduce, launch_sparse_allreduce

    set_env(rank, world_size, port)
    env = init_gloo()
    try:
        buffers = []
        for r in range(world_size):
            g = torch.Generator().manual_seed(r)
            b = torch.zeros(5000, dtype=torch.float64)
            b[torch.randperm(5000, generator=g)[:40 + 10 * r]] = torch.randn(40 + 10 * r, generator=g, dtype=torch.float64)
            buffers.append(b)
        expected = sum(buffers) / world_size
        out = {}
        for name in ("counted", "bounded"):
            mine = buffers[rank].clone()
            D.barrier(env)
            if rank == world_size - 1:
                time.sleep(1.5)
            t0 = time.perf_counter()
            if name == "counted":  # its counts' all-gather is synchronous (a host read): it waits for the last
                _, fut = launch_sparse_allreduce(mine, world_size, 1.0)  # rank; only the pairs' gather is async
            else:
                _, _, fut = launch_bounded_sparse_allreduce(mine, world_size, 200)
            out[name] = {"launch_s": time.perf_counter() - t0, "pending": not fut.done()}
            result = fut.wait()
            out[name]["max_error"] = float((result - expected).abs().max())
            out[name]["is_buffer"] = result is mine
        torch.save(out, Path(out_dir) / f"exchange_rank_{rank}.pt")
    finally:
        D.shutdown(env)


def row_exchange_worker(rank: int, world_size: int, port: int, out_dir: str):
    """strategy.sparse_tables' exchange (launch_row_exchange) in three cases: every rank row-sparse; one rank
    dense, the other sparse (a step that read more corners than rows on one rank: all go dense); one rank with
    no rows at all. Saves each case's result (dense) and every rank's input (dense); also the gradients of
    :func:`kept_out_gradients` (the tables kept out of DDP's buckets, in the same process group)."""
    from distnerf.strategy.sparse_exchange import launch_row_exchange

    set_env(rank, world_size, port)
    env = init_gloo()
    try:
        gen = torch.Generator().manual_seed(rank)
        rows_n, channels = 40, 3

        def sparse(n: int) -> torch.Tensor:
            rows = torch.randperm(rows_n, generator=gen)[:n].sort().values
            return torch.sparse_coo_tensor(rows[None], torch.randn(n, channels, generator=gen, dtype=torch.float64),
                                           (rows_n, channels)).coalesce()

        cases = {"sparse": sparse(7 + 5 * rank),
                 "mixed": sparse(9) if rank else torch.randn(rows_n, channels, generator=gen, dtype=torch.float64),
                 "empty": sparse(0 if rank else 6)}
        out = {}
        for name, grad in cases.items():
            nbytes, fut, kind = launch_row_exchange(grad.clone(), world_size)
            result = fut.wait()
            out[name] = {"input": grad.to_dense(), "result": result.to_dense(), "sparse": result.is_sparse,
                         "kind": kind, "bytes": nbytes,
                         "rows": sorted(result.coalesce().indices()[0].tolist()) if result.is_sparse else None,
                         "own_rows": sorted(grad.coalesce().indices()[0].tolist()) if grad.is_sparse else None}
        out["kept_out"] = kept_out_gradients(rank)
        torch.save(out, Path(out_dir) / f"rank_{rank}.pt")
    finally:
        D.shutdown(env)
