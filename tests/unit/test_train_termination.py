"""Where a training render cuts rays (``model.train_termination``): by default every marched
sample is rendered with gradients in one density evaluation; with the key, a no-grad pass first
finds each ray's termination point (the rule evaluation always applies). Checked on a float64
grid dense enough for the cut to remove samples, against the same model with termination 0."""
from __future__ import annotations

import torch

from distnerf.model.grid import GridModel
from tests.dist.workers import make_problem

AABB = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])


def _model(**keys) -> GridModel:
    torch.manual_seed(7)
    m = GridModel(AABB, torch.zeros(3), resolutions=[8], upsample_steps=[], color="sh", tighten_aabb=False,
                  **keys).double()
    with torch.no_grad():
        m.density.copy_(torch.randn_like(m.density) * 3.0 + 9.0)  # opaque: rays terminate inside the box
        m.features.copy_(torch.randn_like(m.features))
    return m


def _render(model: GridModel, grad: bool) -> dict:
    rays, _ = make_problem(48, seed=3)
    with torch.set_grad_enabled(grad):
        return model(rays, torch.Generator().manual_seed(11))


def test_training_render_evaluates_each_marched_sample_once_by_default():
    model, exact = _model(), _model(termination=0.0)
    out, ref = _render(model, True), _render(exact, True)
    assert model.current_termination() == 0.0 and not model.train_termination
    assert out["num_density_samples"] == out["num_samples"]  # one evaluation, no no-grad pass
    torch.testing.assert_close(out["rgb"], ref["rgb"], rtol=0, atol=0)  # nothing cut: the exact render
    out["rgb"].sum().backward()
    assert model.density.grad is not None and model.density.grad.abs().sum() > 0


def test_train_termination_cuts_training_rays_within_its_bound():
    model, exact = _model(train_termination=True), _model(termination=0.0)
    out, ref = _render(model, True), _render(exact, True)
    assert model.current_termination() == model.termination == 1e-4
    cut = out["num_density_samples"] - out["num_samples"]  # the no-grad pass, then the kept samples again
    assert 0 < cut < out["num_samples"]  # some samples lay behind a termination point
    # a cut changes a channel by less than the termination threshold (renderer/marching.py's bound)
    assert (out["rgb"] - ref["rgb"]).abs().max() < model.termination


def test_evaluation_cuts_rays_whatever_the_training_rule():
    model = _model(eval_round_steps=2)  # rounds shorter than the rays
    with torch.no_grad():
        assert model.current_termination() == model.termination
    model.eval()
    out = _render(model, False)
    exact = _model(termination=0.0, eval_round_steps=2).eval()
    ref = _render(exact, False)
    assert out["num_samples"] < ref["num_samples"]  # rounds stop at the cut: fewer samples marched
    assert (out["rgb"] - ref["rgb"]).abs().max() < model.termination
