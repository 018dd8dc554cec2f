"""Checkpoint manifests, commit markers, pruning and config hashes."""
from __future__ import annotations

import json

import pytest
import torch

from distnerf import checkpoint as ckpt
from distnerf.fileio import atomic_torch_save


def make(root, step, world_size=2, commit=True):
    d = ckpt.step_dir(root, step)
    d.mkdir(parents=True)
    atomic_torch_save({"model": {"w": torch.full((3,), float(step))}, "step": step}, d / "model.pt")
    for r in range(world_size):
        atomic_torch_save({"rank": r}, d / f"rank_{r}.pt")
    if commit:
        ckpt.write_manifest(d, step, world_size, {"model": "m"})
    return d


def test_latest_skips_uncommitted_and_corrupt(tmp_path):
    make(tmp_path, 10)
    make(tmp_path, 20, commit=False)  # a rank died before the manifest
    bad = make(tmp_path, 30)
    (bad / "rank_1.pt").write_bytes(b"truncated")  # size differs from the manifest
    assert ckpt.latest(tmp_path) == ckpt.step_dir(tmp_path, 10)
    with pytest.raises(ckpt.CheckpointError, match="missing or size differs"):
        ckpt.read_manifest(bad)


def test_checksum_verification_detects_same_size_corruption(tmp_path):
    d = make(tmp_path, 5)
    data = bytearray((d / "model.pt").read_bytes())
    data[-1] ^= 0xFF
    (d / "model.pt").write_bytes(bytes(data))
    ckpt.read_manifest(d)  # sizes agree
    with pytest.raises(ckpt.CheckpointError, match="checksum"):
        ckpt.read_manifest(d, verify=True)


def test_manifest_lists_files_sizes_and_hashes(tmp_path):
    d = make(tmp_path, 7, world_size=3)
    m = json.loads((d / ckpt.MANIFEST).read_text())
    assert m["step"] == 7 and m["world_size"] == 3
    assert set(m["files"]) == {"model.pt", "rank_0.pt", "rank_1.pt", "rank_2.pt"}
    assert m["files"]["model.pt"]["bytes"] == (d / "model.pt").stat().st_size
    assert not list(d.glob("*.tmp"))


def test_prune_keeps_newest_k_committed_only_after_newer_commit(tmp_path):
    for s in (1, 2, 3):
        make(tmp_path, s)
    make(tmp_path, 4, commit=False)  # in flight: must not count as committed, must not be removed
    ckpt.prune(tmp_path, keep=2)
    assert [d.name for d in sorted(tmp_path.glob("step_*"))] == ["step_00000002", "step_00000003", "step_00000004"]


def test_config_hash_mismatch_names_section(tmp_path):
    cfg = {"model": {"name": "grid"}, "dataset": {"name": "blender"}, "strategy": {"name": "ddp"}}
    h = ckpt.config_hashes(cfg)
    d = make(tmp_path, 1)
    manifest = {"config": h}
    ckpt.check_compatible(manifest, h, d)
    other = ckpt.config_hashes({**cfg, "dataset": {"name": "llff"}})
    with pytest.raises(ckpt.CheckpointError, match="the dataset config differs"):
        ckpt.check_compatible(manifest, other, d)


def test_config_hash_ignores_where_the_scene_is_cached_and_compile_settings():
    """Each node of a multi-node run may keep the built-in scene in its own directory
    (tests/launch/test_two_nodes.py resumes on nodes whose ``dataset.cache_dir`` differ)."""
    cfg = {"model": {"name": "grid", "compile": False}, "dataset": {"name": "synthetic", "cache_dir": "/a"},
           "strategy": {"name": "ddp"}}
    h = ckpt.config_hashes(cfg)
    assert ckpt.config_hashes({**cfg, "dataset": {"name": "synthetic", "cache_dir": "/b"},
                               "model": {"name": "grid", "compile": True}}) == h
    assert ckpt.config_hashes({**cfg, "dataset": {"name": "synthetic", "cache_dir": "/a", "resolution": 8}}) != h
    assert cfg["dataset"] == {"name": "synthetic", "cache_dir": "/a"}  # the caller's config is not changed


def test_a_key_added_at_its_old_behaviour_still_resumes_a_checkpoint_written_before_it():
    """A checkpoint written before ``model.density_activation`` existed hashed the grid's section without it; a run
    at the default (softplus: the old behaviour) resumes it, a run set to trunc_exp does not."""
    from omegaconf import OmegaConf

    from distnerf.schema import GridModelConfig

    model = OmegaConf.to_container(OmegaConf.structured(GridModelConfig))
    assert model["density_activation"] == "softplus"
    before = {k: v for k, v in model.items() if k != "density_activation"}
    rest = {"dataset": {"name": "synthetic"}, "strategy": {"name": "ddp"}}
    written = ckpt.config_hashes({"model": before, **rest})
    assert ckpt.config_hashes({"model": model, **rest}) == written
    assert ckpt.config_hashes({"model": {**model, "density_activation": "trunc_exp"}, **rest}) != written
    assert ckpt.config_hashes({"model": {**model, "viewdir_encoding": "sh"}, **rest}) != written


@pytest.mark.parametrize("other", [2, ckpt.FORMAT_VERSION + 1])  # older without a converter, newer
def test_checkpoint_of_another_format_is_refused_naming_both_versions(tmp_path, other):
    d = make(tmp_path, 3)
    manifest = json.loads((d / ckpt.MANIFEST).read_text())
    assert manifest["format"] == ckpt.FORMAT_VERSION and other not in ckpt.CONVERTERS
    (d / ckpt.MANIFEST).write_text(json.dumps({**manifest, "format": other}))
    expected = (rf"format {other}, this distnerf reads format {ckpt.FORMAT_VERSION} "
                rf"\(written by an? {'older' if other < ckpt.FORMAT_VERSION else 'newer'}")
    with pytest.raises(ckpt.CheckpointFormatError, match=expected):
        ckpt.read_manifest(d)
    with pytest.raises(ckpt.CheckpointFormatError):  # resume refuses it rather than starting afresh
        ckpt.latest(tmp_path)


def test_format_3_is_read_through_its_converter(tmp_path, caplog):
    """A format-3 ss checkpoint with per-rank optimizer files: read as format 5 with the
    per-rank layout; its dataset hash (which covered cache_dir, and root) is not compared on resume,
    and the log says so; a format-5 checkpoint's dataset hash still is."""
    d = make(tmp_path, 5)
    atomic_torch_save({"state": {}}, d / ckpt.optimizer_file(0))
    cfg = {"model": {"name": "grid"}, "dataset": {"name": "synthetic", "cache_dir": "/a"}, "strategy": {"name": "ss"}}
    ckpt.write_manifest(d, 5, 2, ckpt.config_hashes(cfg))
    manifest = json.loads((d / ckpt.MANIFEST).read_text())
    del manifest["optimizer_layout"]
    other_dataset = ckpt.config_hashes({**cfg, "dataset": {"name": "synthetic", "resolution": 8}})
    (d / ckpt.MANIFEST).write_text(json.dumps({**manifest, "format": 3}))
    read = ckpt.read_manifest(d, verify=True)
    assert read["format"] == ckpt.FORMAT_VERSION and read["optimizer_layout"] == "per_rank"
    assert sorted(read["unchecked"]) == ["data", "dataset"]
    with caplog.at_level("WARNING", logger="distnerf"):
        ckpt.check_compatible(read, other_dataset, d)  # the dataset section is not compared
    assert "dataset config is not compared" in caplog.text
    with pytest.raises(ckpt.CheckpointError, match="the model config differs"):  # the others still are
        ckpt.check_compatible(read, {**other_dataset, "model": "x"}, d)
    (d / ckpt.optimizer_file(0)).unlink()
    manifest["files"].pop(ckpt.optimizer_file(0))
    (d / ckpt.MANIFEST).write_text(json.dumps({**manifest, "format": 3}))
    assert ckpt.read_manifest(d)["optimizer_layout"] == "per_region"
    (d / ckpt.MANIFEST).write_text(json.dumps({**manifest, "format": 4}))  # format 4: root hashed, no data hash
    assert "dataset.root" in ckpt.read_manifest(d)["unchecked"]["dataset"]
    (d / ckpt.MANIFEST).write_text(json.dumps({**manifest, "format": 5}))  # format 5: compared
    with pytest.raises(ckpt.CheckpointError, match="the dataset config differs"):
        ckpt.check_compatible(ckpt.read_manifest(d), other_dataset, d)


def test_moved_data_resumes_and_other_data_is_refused(tmp_path):
    """``dataset.root`` is not hashed; the data hash (relative names and file sizes of the training
    images) is equal for the same files under another root and differs when one changes."""
    cfg = {"model": {"name": "grid"}, "dataset": {"name": "blender", "root": "/data/lego"}, "strategy": {"name": "ddp"}}
    assert ckpt.config_hashes({**cfg, "dataset": {"name": "blender", "root": "/scratch/lego"}}) == ckpt.config_hashes(cfg)
    sizes = {"train/r_0.png": 10, "train/r_1.png": 12}
    for root in ("a", "b"):
        for name, n in sizes.items():
            (tmp_path / root / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / root / name).write_bytes(b"x" * n)

    def digest(root, names=tuple(sizes)):
        return ckpt.data_hash([str(tmp_path / root / n) for n in names], str(tmp_path / root), (8, 8))

    saved = digest("a")
    assert digest("b") == saved  # the same data, moved
    assert ckpt.data_hash([str(tmp_path / "a" / n) for n in sizes], str(tmp_path / "a"), (8, 9)) != saved
    assert digest("b", tuple(reversed(sizes))) != saved  # another order: other image indices
    (tmp_path / "b" / "train/r_1.png").write_bytes(b"x" * 13)  # one image rewritten
    assert digest("b") != saved
    d = make(tmp_path / "ckpts", 1)
    with pytest.raises(ckpt.CheckpointError, match=r"the data \(the names and file sizes of the training images"):
        ckpt.check_compatible({"config": {"data": saved}}, {"data": digest("b")}, d)
    (tmp_path / "b" / "train/r_1.png").unlink()
    with pytest.raises(FileNotFoundError, match="r_1.png: training image missing"):
        digest("b")


def test_manifest_without_format_is_the_old_format(tmp_path):
    d = make(tmp_path, 4)
    manifest = json.loads((d / ckpt.MANIFEST).read_text())
    del manifest["format"]
    (d / ckpt.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ckpt.CheckpointFormatError, match="format 1,"):
        ckpt.read_manifest(d)


def test_a_committed_checkpoint_missing_a_file_names_the_step_the_file_and_the_manifest(tmp_path):
    d = make(tmp_path, 12)
    (d / "rank_1.pt").unlink()  # e.g. an ss region file lost after the commit
    assert ckpt.latest(tmp_path) is None
    broken = ckpt.damaged(tmp_path)
    assert len(broken) == 1
    assert "step 12: rank_1.pt missing (listed in" in broken[0] and str(d / ckpt.MANIFEST) in broken[0]
    make(tmp_path, 20, commit=False)  # uncommitted: not damaged, just not there yet
    assert len(ckpt.damaged(tmp_path)) == 1


class _Payload:
    """An object whose unpickling would run code (what weights_only=True refuses)."""

    def __reduce__(self):
        return (print, ("pickled code ran",))


def test_a_checkpoint_file_with_pickled_objects_is_refused_naming_it(tmp_path, capsys):
    path = tmp_path / "model.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "extra": _Payload()}, path)
    with pytest.raises(ckpt.CheckpointError, match="model.pt: not a data-only checkpoint file"):
        ckpt.load_file(path)
    assert "pickled code ran" not in capsys.readouterr().out


def test_rng_state_is_data_only_and_restores_every_generator(tmp_path):
    import random

    import numpy as np

    from distnerf import distributed as D

    state = D.rng_state()
    path = tmp_path / "rank_0.pt"
    atomic_torch_save({"rng": state}, path)
    expected = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])
    D.set_rng_state(ckpt.load_file(path)["rng"])
    again = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1]) and expected[2] == again[2]


# ----------------------------------------------------------------------------- cadence and background writes
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from types import SimpleNamespace  # noqa: E402

from distnerf.distributed import DistEnv  # noqa: E402
from distnerf.engine import checkpoint_cadence  # noqa: E402
from distnerf.config_check import section  # noqa: E402
from distnerf.engine.checkpoint_cadence import Checkpointer  # noqa: E402
from distnerf.schema import CheckpointsConfig  # noqa: E402
from distnerf.fileio import CheckpointWriteError  # noqa: E402
from distnerf.strategy import build_strategy  # noqa: E402
from tests.conftest import REPO  # noqa: E402


class Sampler:
    def state_dict(self):
        return {"seed": 1, "stream": 0}


def checkpointer(root, every_minutes=0.0, marks=(), keep=5):
    cfg = section(CheckpointsConfig, every=10, every_minutes=every_minutes, at_minutes=list(marks), keep=keep,
                  background=True)
    return Checkpointer(root, cfg, build_strategy({"name": "ddp"}, DistEnv()), {"model": "m"})


class Optimizer:  # an optimizer's state_dict without building one (torch.optim's first use imports dynamo: seconds)
    def __init__(self, model):
        self.moments = {i: {"exp_avg": torch.zeros_like(p)} for i, p in enumerate(model.parameters())}

    def state_dict(self):
        return {"state": self.moments, "param_groups": []}


def save(c, step, model, background=False, optimizer=None):
    return c.save(step, float(step), model, optimizer or Optimizer(model), Sampler(), {"budget_fraction": None},
                  background=background)


def test_minutes_cadence_with_marks_long_steps_and_resume(tmp_path):
    c = checkpointer(tmp_path, every_minutes=1.0, marks=[1.5])
    c.start(0.0)
    assert not c.mark_passed(59.9) and c.mark_passed(60.0)
    c._consume_due(60.0)                        # the 1-minute multiple: next the 1.5-minute mark
    assert not c.mark_passed(89.0) and c.mark_passed(90.0)
    c._consume_due(90.5)
    assert not c.mark_passed(119.0) and c.mark_passed(120.0)
    c._consume_due(250.0)                       # a long step passed 120, 180 and 240: one save, next at 300
    assert not c.mark_passed(299.0) and c.mark_passed(300.0)
    c.start(130.0)                              # resumed at 130 s of training: next multiple 180 s
    assert not c.mark_passed(179.0) and c.mark_passed(180.0)
    off = checkpointer(tmp_path)
    off.start(0.0)
    assert not off.mark_passed(1e9)


def test_background_write_is_a_snapshot_and_commits_only_when_done(tmp_path, monkeypatch):
    model = torch.nn.Linear(3, 2)
    c = checkpointer(tmp_path)
    save(c, 10, model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    gate, real = threading.Event(), checkpoint_cadence.atomic_torch_save

    def slow(obj, path):
        assert gate.wait(10)
        real(obj, path)

    monkeypatch.setattr(checkpoint_cadence, "atomic_torch_save", slow)
    opt = Optimizer(model)
    d = save(c, 20, model, background=True, optimizer=opt)  # returns after the host copy
    with torch.no_grad():
        model.weight.add_(100.0)                # training goes on while the thread writes
        opt.moments[0]["exp_avg"].add_(1.0)
    assert ckpt.latest(tmp_path) == ckpt.step_dir(tmp_path, 10)  # not committed yet
    gate.set()
    c.wait()
    assert ckpt.latest(tmp_path) == d and ckpt.read_manifest(d, verify=True)["step"] == 20
    saved = ckpt.load_file(d / ckpt.MODEL_FILE)["model"]
    assert torch.equal(saved["weight"], before["weight"]) and torch.equal(saved["bias"], before["bias"])
    assert not ckpt.load_file(d / ckpt.MODEL_FILE)["optimizer"]["state"][0]["exp_avg"].any()


def test_a_failed_background_write_raises_at_the_next_save_and_keeps_the_last(tmp_path, monkeypatch):
    model = torch.nn.Linear(3, 2)
    c = checkpointer(tmp_path)
    save(c, 10, model)

    def full_disk(obj, path):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(checkpoint_cadence, "atomic_torch_save", full_disk)
    save(c, 20, model, background=True)
    with pytest.raises(CheckpointWriteError, match="step_00000020 not committed: rank 0: .*No space left") as err:
        save(c, 30, model)                      # the next save waits for the failed one and stops the run
    assert "step_00000010, is intact" in str(err.value)
    assert [d.name for d in ckpt.committed(tmp_path)] == ["step_00000010"]
    assert not ckpt.step_dir(tmp_path, 20).exists() and not ckpt.step_dir(tmp_path, 30).exists()
    ckpt.read_manifest(ckpt.step_dir(tmp_path, 10), verify=True)


KILLED_WRITER = """
import os, sys, time, torch
from pathlib import Path
from distnerf.engine import checkpoint_cadence
from tests.unit.test_checkpoint import checkpointer, save
root, model = Path(sys.argv[1]), torch.nn.Linear(256, 256)
c = checkpointer(root)
save(c, 10, model)
real = checkpoint_cadence.atomic_torch_save
def torn(obj, path):  # model.pt whole, then the rank file half-written when the process is killed
    if path.name != "rank_0.pt":
        return real(obj, path)
    with open(str(path) + ".tmp", "wb") as f:
        f.write(b"partial")
        f.flush()
    print("writing", flush=True)
    time.sleep(60)
checkpoint_cadence.atomic_torch_save = torn
save(c, 20, model, background=True)
with torch.no_grad():
    model.weight.add_(1.0)  # the loop goes on
time.sleep(60)
"""


def test_a_process_killed_during_the_background_write_keeps_the_last_committed(tmp_path):
    root = tmp_path / "checkpoints"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(root)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing", proc.stderr.read()
        assert (ckpt.step_dir(root, 20) / ckpt.MODEL_FILE).exists()  # midway: one file whole, one torn
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(30)
    torn = ckpt.step_dir(root, 20)
    assert (torn / "rank_0.pt.tmp").exists() and not (torn / ckpt.MANIFEST).exists()
    assert [d.name for d in ckpt.committed(root)] == ["step_00000010"]  # the torn one is not taken as committed
    assert ckpt.read_manifest(ckpt.latest(root), verify=True)["step"] == 10
    c = checkpointer(root)
    assert c.find_resume(True) == ckpt.step_dir(root, 10)
    assert ckpt.load_file(ckpt.step_dir(root, 10) / ckpt.MODEL_FILE)["step"] == 10
    d = save(c, 20, torch.nn.Linear(256, 256))  # the same step again, over the torn directory: committed
    assert ckpt.read_manifest(d, verify=True)["step"] == 20 and set(ckpt.read_manifest(d)["files"]) == {
        "model.pt", "rank_0.pt"}
