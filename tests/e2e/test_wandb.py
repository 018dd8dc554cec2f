"""W&B dashboards from a real 2-rank run (issue 27, part 2): image panels at each validation and of the
test views, per-rank step figures gathered into the one W&B run, the group and job type set from the
strategy. Checked in the offline run file wandb writes (``run-*.wandb``), its records parsed with
wandb's own protobuf definitions (``wandb.proto.wandb_internal_pb2.Record``) from LevelDB's log framing."""
from __future__ import annotations

import json
import struct

import pytest
from PIL import Image

from tests.conftest import REPO, run_cli, torchrun

wandb_pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")

BLOCK, HEADER = 32768, 7  # LevelDB log blocks; wandb's file header (":W&B", magic, version)


def records(path):
    """Every Record of a .wandb file (LevelDB log format: 7-byte chunk headers, FULL/FIRST/MIDDLE/LAST)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, pending, out = HEADER, b"", []
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a chunk header: zero padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            rec = wandb_pb.Record()
            rec.ParseFromString(pending)
            out.append(rec)
            pending = b""
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("wandb") / "run"
    run_cli([*torchrun(2), "-m", "distnerf.train", "experiment=smoke", "dataset=synthetic", "dataset.resolution=24",
             "strategy=ddp", "train.max_steps=10", "train.log_every=5", "train.val_every=5", "train.val_views=1",
             "eval.num_views=2", "train.progress=false", "logger.wandb.mode=offline", f"run_dir={run_dir}"],
            env={"WANDB_MODE": "offline"}, timeout=300)
    files = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    return run_dir, files[0].parent, records(files[0])


def test_group_job_type_and_world_size(run):
    _, _, recs = run
    meta = next(r.run for r in recs if r.WhichOneof("record_type") == "run")
    assert meta.run_group == "ddp" and meta.job_type == "train"
    config = {i.key: json.loads(i.value_json) for r in recs if r.WhichOneof("record_type") == "config"
              for i in r.config.update}
    config.update({i.key: json.loads(i.value_json) for i in meta.config.update})
    assert config["world_size"] == 2 and config["strategy_label"] == "ddp"


def _value(item):
    kind = item.WhichOneof("value") if "value" in [o.name for o in item.DESCRIPTOR.oneofs] else None
    if kind and kind != "value_json":
        return getattr(item, kind)
    return json.loads(item.value_json) if item.value_json else None


def history(recs) -> dict:
    """{step: {key: value}} of the history records."""
    out = {}
    for r in recs:
        if r.WhichOneof("record_type") == "history":
            items = {}
            for i in r.history.item:
                path = [i.key] if i.key else list(i.nested_key)
                if len(path) == 1:
                    items[path[0]] = _value(i)
                else:  # an image's fields: nested keys ["val/r_0", "width"] -> {"val/r_0": {"width": ...}}
                    items.setdefault("/".join(path[:-1]), {})[path[-1]] = _value(i)
            out.setdefault(items.get("_step"), {}).update(items)
    return out


def test_per_rank_figures_of_both_ranks(run):
    _, _, recs = run
    rows = [row for row in history(recs).values() if "loss" in row]
    assert rows
    for row in rows:
        for rank in (0, 1):
            assert row[f"rank{rank}/step_ms"] > 0 and row[f"rank{rank}/rays_per_s"] > 0
            assert row[f"rank{rank}/peak_rss_mb"] > 0


def test_validation_and_test_panels_with_their_sizes(run):
    _, files, recs = run
    rows = history(recs)
    val = {k: v for row in rows.values() for k, v in row.items() if k.startswith("val/") and isinstance(v, dict)}
    test = {k: v for row in rows.values() for k, v in row.items() if k.startswith("test/") and isinstance(v, dict)}
    assert val and len(test) == 2, (list(val), list(test))
    for key, image in {**val, **test}.items():
        assert image["_type"] == "image-file" and image["height"] == 24 and image["width"] == 3 * 24, (key, image)
        with Image.open(files / "files" / image["path"]) as im:  # ground truth | prediction | depth
            assert im.size == (72, 24)
    steps_with_val = sorted(s for s, row in rows.items() if any(k.startswith("val/") for k in row))
    assert steps_with_val == [5, 10]
