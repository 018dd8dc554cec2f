"""The fake-CUDA lane's scenarios, run in their own process: ``python tests/fake_cuda/scenarios.py LIBRARY [NAME ...]``.

The library (``fake_cuda.cpp``, built by :mod:`tests.fake_cuda.build`) is loaded before torch is imported, which is
why this is a process of its own (the suite's process has imported torch). Prints one JSON object: per scenario,
what it ran (steps, grid stages, captures, replays, chunks, the sampler, the batches' and learning rates' devices)
and its events and problems (:func:`tests.fake_cuda.lane.problems`); ``error`` holds a scenario's traceback (a
device mismatch raises). Scenarios (``NAME``; default all):

* ``static``: the CUDA default training step: ``sampler=auto``, ``step.samples_per_step`` null (the static step
  and its 2^18-slot budget), the batch the entry point sets (``STATIC_RAYS_PER_RANK``); steps across an occupancy
  refresh and a grid stage.
* ``static_ngp``: the same step with ``model=ngp`` (the other model the static step covers), a few steps.
* ``graphed``: ``step.cuda_graph`` and ``step.bf16``: warm-up, capture, replays across an occupancy refresh and a
  grid stage (captured again), capturable Adam with 0-dim device learning rates, a probe step.
* ``evaluation``: one whole test view rendered in chunks by the trained graphed model (``render_image``: evaluation's
  march in fixed rounds).
* ``injected``: the graphed step with a host read, a synchronize and a host-to-device copy put into its loss, and a
  CPU tensor added to a CUDA one: what the lane must report (the test checks that it does).
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STATIC_STEPS = 12  # past the first occupancy refresh (step 8) and the smoke grid's stage change (step 10)
GRAPHED_STEPS = 18  # also: a capture in each grid stage (3 warm-up steps each), probe steps (7, 14), a replay at the
# second stage's refresh (16: the first, at 8, changes the occupancy grid's shape and rekeys)
NGP_STEPS = 4  # the static step on the hash grid (its stages and refreshes: the grid's scenarios)
INJECTED_STEPS = 5  # a capture (after 3 warm-up steps) and a replay
CUDA = ["device=cuda", "sampler=auto", "model=grid", "train.global_rays=null"]


def load(library: str) -> None:
    """The fake-CUDA library, before torch (its registrations must be in place when torch starts)."""
    if "torch" in sys.modules:
        raise RuntimeError("scenarios.py: torch was imported before the fake-CUDA library")
    ctypes.CDLL(library, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    sys.path.insert(0, str(REPO))


def _graphed(trainer):
    """The trainer's graphed step (:class:`~distnerf.components.graphed_step.GraphedStep`), or None."""
    from distnerf.components.graphed_step import GraphedStep

    for candidate in (getattr(trainer, "graphed", None), _step(trainer)):
        if isinstance(candidate, GraphedStep):
            return candidate
    return None


def _step(trainer):
    """The trainer's step object (``train_step``; ``step_fn`` before the step-path refactor)."""
    return getattr(trainer, "train_step", None) or getattr(trainer, "step_fn", None)


def _train(lane, name: str, overrides: list[str], steps: int, run_dir: Path, inject=None) -> tuple[dict, object]:
    """``steps`` steps of the trainer built on fake CUDA (``tests.trainers``); returns its facts and the trainer
    (closed; its model kept for evaluation)."""
    import torch

    from distnerf import distributed as D
    from distnerf.components.sample_budget import STATIC_RAYS_PER_RANK, static_by_default

    from tests.trainers import build_trainer, run_step

    facts: dict = {"steps": 0, "stages": 0, "batches": [], "stage_steps": []}
    with lane.labelled(name):
        lane.step = -1
        trainer, env = build_trainer([*CUDA, f"train.rays_per_rank={STATIC_RAYS_PER_RANK}", *overrides],
                                     run_dir, device="cuda")
        try:
            lane.model = trainer.model
            facts["static_by_default"] = static_by_default(trainer.cfg, trainer.device)
            facts["sampler"] = trainer.sampler.name
            facts["device"] = str(trainer.device)
            facts["param_devices"] = sorted({str(p.device) for p in trainer.model.parameters()})
            if inject is not None:
                inject(trainer)
            resolution = object()  # the first step enters the first stage
            for i in range(steps):
                lane.step = i
                batch, *_ = run_step(trainer)
                facts["steps"] += 1
                facts["batches"].append(sorted({str(t.device) for t in (*batch.rays.tensors(), batch.rgb, batch.valid)}
                                               if hasattr(batch.rays, "tensors") else
                                               {str(t.device) for t in (batch.rays.origins, batch.rays.directions,
                                                                        batch.rays.near, batch.rays.far, batch.rgb,
                                                                        batch.valid)}))
                if trainer.model.resolution != resolution:
                    facts["stages"] += 1
                    facts["stage_steps"].append(i)
                    resolution = trainer.model.resolution
            step = _step(trainer)
            budget = getattr(step, "budget", None) or getattr(getattr(step, "step", None), "budget", None)
            facts["budget_slots"] = None if budget is None else budget.capacity
            optimizer = trainer.optimizer
            facts["optimizer"] = {
                "capturable": [bool(g.get("capturable")) for g in optimizer.param_groups],
                "lr": sorted({str(g["lr"].device) if torch.is_tensor(g["lr"]) else "float"
                              for g in optimizer.param_groups}),
                "state_steps": sorted({str(s["step"].device) for s in optimizer.state.values() if "step" in s})}
            graphed = _graphed(trainer)
            if graphed is not None:
                facts["graph"] = {"captures": graphed.captures, "replays": graphed.replays,
                                  "eager_steps": graphed.eager_steps, "probes": graphed.probes,
                                  "captured": graphed.captured, "replay_steps": list(lane.replay_steps)}
            lane.replay_steps.clear()
        finally:
            lane.step = None
            trainer.close()
            D.shutdown(env)
    every = trainer.cfg.model.get("occupancy_every")
    facts["refresh_steps"] = [s for s in range(1, steps) if every and s % int(every) == 0]
    facts["refreshes"] = len(facts["refresh_steps"])
    return facts, trainer


def _evaluate(lane, trainer) -> dict:
    """One whole test view of ``trainer``'s model, rendered as evaluation renders it (fixed rounds on CUDA)."""
    from distnerf.data import load_scene
    from distnerf.engine.evaluate import render_image

    cfg = trainer.cfg
    scene = load_scene(cfg.dataset, "test")
    h, w = scene.cameras.size(0)
    chunk = max(1, (h * w) // 4)  # four chunks: the per-chunk reads counted
    with lane.labelled("evaluation"):
        out = render_image(trainer.model, scene, 0, chunk, trainer.device)
    return {"chunks": -(-h * w // chunk), "stages": 1, "pixels": h * w,
            "rgb_shape": list(out["rgb"].shape), "rgb_device": str(out["rgb"].device)}


def _inject(trainer) -> None:
    """A host read, a synchronize and a host-to-device copy in the training loss (eager and captured)."""
    import torch

    from distnerf.components import graphed_step, loss, step

    original = loss.ray_error

    def leaky(out, rgb, valid):
        error = original(out, rgb, valid)
        float(error.sse)  # a host read of a device value
        torch.cuda.synchronize()
        error.sse.add_(torch.tensor(0.0, device=rgb.device))  # a host-to-device copy
        return error

    for module in (graphed_step, step):
        if getattr(module, "ray_error", None) is original:
            setattr(module, "ray_error", leaky)


def _mismatch(lane) -> str | None:
    """A CPU tensor added to a CUDA one: the message the lane raises, or None when it does not."""
    import torch

    with lane.labelled("mismatch"):
        try:
            torch.ones(3, device="cuda") + torch.ones(3)
        except Exception as err:  # noqa: BLE001  (FakeTensorMode's device check)
            return f"{type(err).__name__}: {err}"
    return None


def main(argv: list[str]) -> dict:
    load(argv[0])
    wanted = set(argv[1:]) or {"static", "static_ngp", "graphed", "evaluation", "injected"}
    from tests.fake_cuda import lane as L

    lane = L.FakeCuda()
    L.install_cuda_stand_ins(lane)
    results: dict = {}
    tmp = Path(tempfile.mkdtemp(prefix="fake_cuda_"))
    graphed_trainer = None
    plan = [("static", [], STATIC_STEPS, None), ("static_ngp", ["model=ngp"], NGP_STEPS, None),
            ("graphed", ["step.cuda_graph=true", "step.bf16=true", "step.probe_every=7", "model.color=mlp"],
             GRAPHED_STEPS, None),
            ("injected", ["step.cuda_graph=true", "step.probe_every=0"], INJECTED_STEPS, _inject)]
    with lane:
        for name, overrides, steps, inject in plan:
            if name not in wanted and not (name == "graphed" and "evaluation" in wanted):
                continue
            start = time.perf_counter()
            try:
                facts, trainer = _train(lane, name, overrides, steps, tmp / name, inject)
                if name == "graphed":
                    graphed_trainer = trainer
                results[name] = {**facts, "error": None}
            except Exception:  # noqa: BLE001  (reported: the test names it)
                results[name] = {"error": traceback.format_exc()}
            results[name]["seconds"] = time.perf_counter() - start
            results[name]["matmul_dtypes"] = dict(lane.matmul_dtypes) if name == "graphed" else None
            lane.matmul_dtypes.clear()
        if "evaluation" in wanted:
            start = time.perf_counter()
            try:
                if graphed_trainer is None:
                    raise RuntimeError("the graphed scenario failed: no trained model to evaluate")
                results["evaluation"] = {**_evaluate(lane, graphed_trainer), "error": None}
            except Exception:  # noqa: BLE001
                results["evaluation"] = {"error": traceback.format_exc()}
            results["evaluation"]["seconds"] = time.perf_counter() - start
        results["mismatch"] = {"message": _mismatch(lane)}
    shutil.rmtree(tmp, ignore_errors=True)
    for name, res in results.items():
        events = [e for e in lane.events if e.scenario == name]
        res["events"] = [vars(e) for e in events]
        res["problems"] = L.problems(events, L.bounds(res))
    return results


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
