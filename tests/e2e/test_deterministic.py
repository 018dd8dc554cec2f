"""``step.deterministic=true`` (torch.use_deterministic_algorithms; the CUDA path of the bit-exact
claims): on the CPU every op of a training step has a deterministic kernel (none raises), and the
trained model is bitwise the one of the default run, ddp and ss joint."""
from __future__ import annotations

import sys

import pytest
import torch

from tests.conftest import REPO, run_cli, torchrun

ARGS = ["experiment=smoke", "device=cpu", "dataset=synthetic", "dataset.resolution=24", "monitor.progress=false",
        "train.max_steps=12", "eval.enabled=false"]


def final_state(run_dir):
    """Every tensor state of the final checkpoint's files (models, optimizers), timings left out."""
    step = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    out = {}
    for p in sorted(step.glob("*.pt")):
        state = torch.load(p, map_location="cpu", weights_only=True)
        out[p.name] = {k: v for k, v in state.items() if k in ("model", "models", "optimizer", "optimizers")}
    return out


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if torch.is_tensor(a):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a == b


@pytest.mark.parametrize("launch, extra", [
    ([sys.executable, "-m", "distnerf.train"], ["strategy=ddp"]),
    (torchrun(2) + ["-m", "distnerf.train"], ["strategy=ss", "strategy.training=joint"]),
])
def test_deterministic_mode_runs_and_trains_the_same_model(tmp_path, launch, extra):
    runs = {}
    for det in ("false", "true"):
        run_dir = tmp_path / det
        run_cli([*launch, *ARGS, *extra, f"run_dir={run_dir}", f"step.deterministic={det}"], cwd=REPO, timeout=300)
        runs[det] = final_state(run_dir)
    assert any(runs["true"].values()) and same(runs["true"], runs["false"])
