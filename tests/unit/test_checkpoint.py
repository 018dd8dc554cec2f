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

    from distnerf import dist as D

    state = D.rng_state()
    path = tmp_path / "rank_0.pt"
    atomic_torch_save({"rng": state}, path)
    expected = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])
    D.set_rng_state(ckpt.load_file(path)["rng"])
    again = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1]) and expected[2] == again[2]
