"""The fake-CUDA lane (issue 62 item 1): the CUDA default step, the graphed step and an evaluation view run on the CPU
with tensors on device ``cuda`` (``tests/fake_cuda/lane.py``), in one process of their own (``scenarios.py``: the
C++ library must load before torch).

Asserted: no device mismatch (a CPU tensor meeting a CUDA one raises there, and the scenarios end without error);
every host read is on the documented list (``lane.ALLOWED``, the table of ``docs/cuda_nccl.md``), no more often than
it says, and every entry is still read; nothing inside a capture synchronises, reads from the device or copies from
the host; batches land on the device. The injected scenario shows the lane catches each kind of problem.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fake_cuda.build import LaneUnavailable, build_library

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = Path(__file__).with_name("scenarios.py")
DOC = REPO / "docs" / "cuda_nccl.md"
TIMEOUT_S = 240
AUTO_SAMPLES = 1 << 18  # the static step's slots with step.samples_per_step null on CUDA (sample_budget.AUTO_SAMPLES)


@pytest.fixture(scope="module")
def lane():
    """The scenarios' JSON (built library from the cache, or built now; one process for every scenario)."""
    try:
        library = build_library()
    except LaneUnavailable as err:
        pytest.skip(f"fake-CUDA lane unavailable: {err}")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run([sys.executable, str(SCENARIOS), str(library)], capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=REPO, env=env)
    assert done.returncode == 0, f"scenarios.py exited {done.returncode}:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout)


def _clean(res: dict) -> None:
    assert res["error"] is None, res["error"]
    assert res["problems"] == [], "\n".join(res["problems"])


def _sites(res: dict) -> set[tuple[str, str]]:
    return {(e["site"], e["op"]) for e in res["events"]}


def test_the_cuda_default_static_step_runs_on_fake_cuda(lane):
    res = lane["static"]
    _clean(res)
    assert res["static_by_default"] and res["budget_slots"] == AUTO_SAMPLES  # samples_per_step null: 2^18 slots
    assert res["sampler"] == "device"  # sampler=auto on CUDA
    assert res["param_devices"] == ["cuda:0"] and res["device"] == "cuda:0"
    assert res["steps"] == 12 and res["stages"] == 2 and res["refreshes"] >= 1  # across a refresh and a stage
    assert all(devices == ["cuda:0"] for devices in res["batches"]), res["batches"]  # batches land on the device
    per_step = [e for e in res["events"] if e["step"] is not None and e["step"] >= 0]
    assert per_step and all(e["op"] == "Event.synchronize" for e in per_step
                            if e["site"].endswith(("_take", "LateFlag.take", "_CudaClock.wait")))


def test_the_static_step_of_the_hash_grid_runs_on_fake_cuda(lane):
    res = lane["static_ngp"]
    _clean(res)
    assert res["budget_slots"] == AUTO_SAMPLES and res["sampler"] == "device" and res["steps"] == 4
    assert res["param_devices"] == ["cuda:0"]
    assert all(devices == ["cuda:0"] for devices in res["batches"]), res["batches"]


def test_the_graphed_step_captures_and_replays_with_capturable_adam_and_bf16(lane):
    res = lane["graphed"]
    _clean(res)
    graph = res["graph"]
    # a capture per grid stage (the first refresh, step 8, changes the occupancy grid's shape: a warm-up again, cut
    # short by the stage at 10; fakes have no addresses, so only shapes rekey here), replays, the probes eager (7, 14)
    assert graph["captures"] == 2 and graph["replays"] > 0 and graph["probes"] == 2 and graph["captured"]
    assert res["refreshes"] >= 1 and res["stages"] == 2
    replays = graph["replay_steps"]
    assert set(replays) & set(res["refresh_steps"]), (replays, res["refresh_steps"])  # replayed at a refresh step
    assert any(s > res["stage_steps"][1] for s in replays), (replays, res["stage_steps"])  # and in the new stage
    opt = res["optimizer"]
    assert all(opt["capturable"]) and opt["lr"] == ["cuda:0"] and opt["state_steps"] == ["cuda:0"]
    assert res["matmul_dtypes"].get("torch.bfloat16", 0) > 0, res["matmul_dtypes"]  # autocast inside the capture
    assert "torch.float32" not in res["matmul_dtypes"], res["matmul_dtypes"]
    captured = [e for e in res["events"] if e["capturing"]]
    assert captured == [], captured  # no host read, wait or copy inside a capture
    assert all(devices == ["cuda:0"] for devices in res["batches"]), res["batches"]


def test_a_whole_evaluation_view_renders_in_fixed_rounds(lane):
    res = lane["evaluation"]
    _clean(res)
    assert res["rgb_shape"][:2] and res["rgb_shape"][0] * res["rgb_shape"][1] == res["pixels"]
    fixed = [e for e in res["events"] if e["site"] == "distnerf/renderer/rounds.py::march_rounds_fixed"]
    assert len(fixed) == res["chunks"] == 4  # the fixed rounds' one size read per chunk (sync_free on CUDA)


def test_the_lane_reports_an_injected_host_read_synchronize_and_copy(lane):
    res = lane["injected"]
    assert res["error"] is None, res["error"]
    injected = "tests/fake_cuda/scenarios.py"  # the leaky loss's frame (scenarios._inject)
    found = [p for p in res["problems"] if injected in p]
    eager = [p for p in found if p.startswith("undocumented host read: ") and "inside a capture" not in p]
    captured = [p for p in found if "inside a capture" in p]
    for what in ("aten._local_scalar_dense", "torch.cuda.synchronize", "aten._to_copy (host to device, blocking)"):
        assert any(f"host read: {what} at distnerf/components/" in p for p in eager), (what, found)
        assert any(f"host read: {what} at distnerf/components/" in p for p in captured), (what, found)
    assert any(p.startswith("inside a capture: torch.cuda.synchronize") for p in captured), found
    assert any(p.startswith("inside a capture: host-to-device copy (aten._to_copy)") for p in captured), found
    assert len(res["problems"]) == len(found), [p for p in res["problems"] if injected not in p]  # nothing else
    assert "device" in (lane["mismatch"]["message"] or ""), lane["mismatch"]  # a CPU tensor meeting a CUDA one


def test_the_documented_host_reads_are_exactly_the_ones_read(lane):
    from tests.fake_cuda.lane import ALLOWED, allowed_table

    seen = set().union(*(_sites(lane[name]) for name in ("static", "static_ngp", "graphed", "evaluation")))
    documented = {(a.site, a.op) for a in ALLOWED}
    assert seen == documented, {"read, not documented": seen - documented, "documented, not read": documented - seen,
                                "to do": "update tests/fake_cuda/lane.py's ALLOWED, then the table in docs/cuda_nccl.md"}
    assert allowed_table() in DOC.read_text(), ("docs/cuda_nccl.md's host-read table differs from lane.ALLOWED: "
                                                "paste the output of python -m tests.fake_cuda.lane")


def test_each_frequency_bound_catches_a_read_too_often():
    from tests.fake_cuda.lane import Allowed, Event, problems

    allowed = (Allowed("a.py::f", "op", "at start", ""), Allowed("a.py::g", "op", "once per step", ""),
               Allowed("a.py::h", "op", "once per stage", "", per=2))

    def event(site, step, kind="read", capturing=False):
        return Event(kind, "op", site, 1, None, capturing, "s", step)

    limits = {"once per stage": 1, "once per capture": 0, "once per chunk": 0}
    assert problems([event("a.py::f", -1), event("a.py::g", 0), event("a.py::g", 1), event("a.py::h", 3),
                     event("a.py::h", 3)], limits, allowed) == []
    assert len(problems([event("a.py::f", 0)], limits, allowed)) == 1  # at start only
    assert len(problems([event("a.py::g", 2), event("a.py::g", 2)], limits, allowed)) == 1  # twice in a step
    assert len(problems([event("a.py::h", 1)] * 3, limits, allowed)) == 1  # 3 > 2 x 1 stage
    assert len(problems([event("b.py::k", 0)], limits, allowed)) == 1  # undocumented
    assert len(problems([event("a.py::g", 0, kind="capture", capturing=True)], limits, allowed)) == 1


def test_the_lane_skips_with_a_named_reason_on_another_torch_build_or_without_a_compiler(monkeypatch, tmp_path):
    from tests.fake_cuda import build

    monkeypatch.setenv("DISTNERF_FAKE_CUDA_CACHE", str(tmp_path))
    monkeypatch.setattr(build.importlib.metadata, "version", lambda name: "2.12.0+cu126")
    with pytest.raises(LaneUnavailable, match=r"torch 2\.12\.0\+cu126 is not the build .* pinned to \(2\.13\.0\+cpu\)"):
        build_library()
    monkeypatch.setattr(build.importlib.metadata, "version", lambda name: build.TORCH_BUILD)
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    with pytest.raises(LaneUnavailable, match="no C\\+\\+ compiler found"):
        build_library()
    assert not list(tmp_path.iterdir())  # nothing built
