"""Golden record of the grid model: a refactoring of :mod:`distnerf.model.grid` must train
exactly as the code that wrote ``tests/fixtures/grid_golden.json`` did (every step's loss and
parameter gradients bit for bit, the same evaluation render, state and state_dict keys; see
``tests/fixtures/make_grid_golden.py`` for the variants: SH, cubic voxels with an MLP and an
appearance embedding, a focus box with context tables, a contracted field).

Bit-exact equality holds on the torch build and CPU kernels that wrote the fixture (its
``platform``); elsewhere the floats are compared to a relative 1e-4 and the keys exactly.
"""
from __future__ import annotations

import json

import pytest
import torch

from tests.fixtures import make_grid_golden as golden

RECORD = json.loads(golden.FIXTURE.read_text())


@pytest.fixture(scope="module")
def replay():
    threads = torch.get_num_threads()
    try:
        return golden.make()
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("variant", sorted(golden.VARIANTS))
def test_training_replays_the_golden_record(replay, variant):
    want, got = RECORD["variants"][variant], replay["variants"][variant]
    assert got["keys_before"] == want["keys_before"] and got["keys_after"] == want["keys_after"]
    assert len(got["steps"]) == len(want["steps"]) == golden.STEPS
    exact = replay["platform"] == RECORD["platform"]
    for i, (g, w) in enumerate(zip(got["steps"], want["steps"])):
        assert sorted(g["grads"]) == sorted(w["grads"]), f"step {i}: parameters with a gradient"
        assert g["num_samples"] == w["num_samples"], f"step {i}: samples marched"
        if exact:
            assert g["loss"] == w["loss"], f"step {i}: loss"
            assert g["grads"] == w["grads"], f"step {i}: gradient sums or hashes"
        else:
            assert g["loss"] == pytest.approx(w["loss"], rel=1e-4), f"step {i}: loss"
            for name, (total, _) in w["grads"].items():
                assert g["grads"][name][0] == pytest.approx(total, rel=1e-3, abs=1e-6), f"step {i}: {name}"
    if exact:
        assert got["eval_rgb"] == want["eval_rgb"] and got["state"] == want["state"]
    else:
        assert got["eval_rgb_sum"] == pytest.approx(want["eval_rgb_sum"], rel=1e-4)


def test_the_record_changes_when_the_training_does(monkeypatch):
    """The record is sensitive: a total-variation weight 1 % larger changes the gradients' hashes."""
    cfg, box, extra = golden.VARIANTS["default_sh"]
    monkeypatch.setitem(golden.VARIANTS, "default_sh", ({**cfg, "tv_weight": cfg["tv_weight"] * 1.01}, box, extra))
    monkeypatch.setattr(golden, "STEPS", 2)
    changed = golden.run_variant("default_sh")
    if golden.platform() == RECORD["platform"]:
        want = RECORD["variants"]["default_sh"]["steps"]
    else:  # other kernels' bits (the record's platform): this host's own run of the unchanged variant
        monkeypatch.setitem(golden.VARIANTS, "default_sh", (cfg, box, extra))
        want = golden.run_variant("default_sh")["steps"]
    assert changed["steps"][0] == want[0]  # a flat initial density: no total variation at the first step
    assert changed["steps"][1]["grads"]["density"] != want[1]["grads"]["density"]
