"""``step.bf16`` for real on the CPU (issue 62 item 2): the static step and the CUDA graph's body run under
torch's CPU bf16 autocast (:func:`distnerf.components.step.bf16_autocast`), so the dtype mistakes that fake
CUDA tensors cannot see (a bfloat16 tensor meeting a float32 one where no autocast rule casts it, a bfloat16
gradient reaching a float32 table) fail here. Reference: the same step in float32, same model, same batch.
The grid's colour is the MLP head (``model.color=mlp``): its matrix products are what autocast casts.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from distnerf import distributed as D
from distnerf.host_buffers import sync_free_paths

from distnerf.components.graphed_step import GraphedStep
from tests import trainers
from tests.conftest import step_sse

STATIC = ["model=grid", "model.color=mlp", "model.train_termination=false", "model.train_round_steps=0",
          "train.global_rays=128", "step.samples_per_step=32768", "model.sparse_grad=false"]
STEPS = 3


class Bf16Ops(TorchDispatchMode):
    """The operators that produced a bfloat16 tensor (autocast at work), by name."""

    def __init__(self):
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 for t in tree_leaves(out)):
            self.names.add(func.__name__.split(".")[0])  # addmm.default -> addmm
        return out


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


def _train(tmp_path, overrides: list[str], steps: int = STEPS, body_grads: bool = False
           ) -> tuple[list[float], dict[str, torch.Tensor], dict]:
    """``steps`` steps of the real trainer: each step's summed error, the gradients the optimizer saw first (with
    ``body_grads``, at the first step of the graph's body), and what ran (the graphed body's calls; the
    operators that made bfloat16 tensors)."""
    torch.manual_seed(0)
    trainer, env = trainers.build_trainer([*STATIC, *overrides], tmp_path)
    seen: dict = {"body": 0}
    losses, grads = [], {}
    try:
        optimizer = trainer.train_step.optimizer

        def recorded(*args, **kwargs):
            if not grads and (seen["body"] or not body_grads):
                grads.update({n: p.grad.detach().clone() for n, p in trainer.model.named_parameters()
                              if p.grad is not None})
            return type(optimizer).step(optimizer, *args, **kwargs)

        optimizer.step = recorded
        graphed = trainer.train_step
        if isinstance(graphed, GraphedStep):
            body = graphed._body

            def counted(*args):
                seen["body"] += 1
                return body(*args)

            graphed._body = counted
        with sync_free_paths(True), Bf16Ops() as ops:  # the CUDA paths (dense tables, no host read) on the CPU
            while trainer.step < steps:
                losses.append(step_sse(trainer, trainers.run_step))
        seen["bf16_ops"] = ops.names
        return losses, grads, seen
    finally:
        trainer.close()
        D.shutdown(env)


def _compare(fp32, bf16) -> None:
    (losses, grads, _), (b_losses, b_grads, _) = fp32, bf16
    assert b_losses != losses  # autocast changed the arithmetic (an identical loss: it never ran in bf16)
    for step, (a, b) in enumerate(zip(losses, b_losses)):
        assert abs(b - a) <= 2e-2 * abs(a), (step, a, b)
    assert grads.keys() == b_grads.keys() and {"density", "features"} <= grads.keys()
    for name, g in grads.items():
        assert b_grads[name].dtype == torch.float32 == g.dtype, name  # float32 tables get float32 gradients
        assert _cosine(b_grads[name], g) >= 0.99, (name, _cosine(b_grads[name], g))


def test_static_step_under_cpu_bf16_autocast_follows_float32(tmp_path):
    fp32 = _train(tmp_path / "fp32", [])
    bf16 = _train(tmp_path / "bf16", ["step.bf16=true"])
    assert not fp32[2]["bf16_ops"] and {"addmm", "mm"} & bf16[2]["bf16_ops"]  # the MLP's products in bf16
    _compare(fp32, bf16)


def test_graph_body_under_cpu_bf16_autocast_follows_float32(tmp_path):
    """The graphed step: its warm-up steps are the eager step's (above), then every step runs the graph's body
    (uncaptured on the CPU); the gradients compared are those of the body's first step."""
    graph = ["step.cuda_graph=true", "step.probe_every=0"]
    steps = 6  # 3 warm-up steps (GraphedStep's default), then 3 through the body
    fp32 = _train(tmp_path / "fp32", graph, steps, body_grads=True)
    bf16 = _train(tmp_path / "bf16", [*graph, "step.bf16=true"], steps, body_grads=True)
    assert bf16[2]["body"] == fp32[2]["body"] == 3
    assert not fp32[2]["bf16_ops"] and {"addmm", "mm"} & bf16[2]["bf16_ops"]
    _compare(fp32, bf16)
