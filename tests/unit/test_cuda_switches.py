"""One place per CUDA choice (issue 62 item 3; docs/cuda_nccl.md, "CUDA-only paths"): a branch that picks a
code path on CUDA asks a named switch, never the device's type itself:

- :func:`distnerf.host_buffers.sync_free`: fixed sizes instead of a host read (CUDA, or the CPU inside
  ``sync_free_paths``); the sparse gradient exchange's mode and refusals too;
- :func:`distnerf.components.sample_budget.resolve_samples_per_step`: the static step or the dynamic one;
- :func:`distnerf.sampler.auto_kind`: the sampler ``sampler=auto`` runs;
- :func:`distnerf.components.step.records_graph`: a CUDA graph recorded and replayed, or its body uncaptured;
- :func:`distnerf.distributed.device_timed`: CUDA events, or the host clock.

The raw device tests left in the package are those switches and guards around device-only APIs (CUDA events,
streams, pinned memory, ``torch.cuda`` calls, NCCL, the CUDA random state): a ceiling per file below."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from distnerf.components.sample_budget import resolve_samples_per_step
from distnerf.components.step import records_graph
from distnerf.config_check import ConfigError
from distnerf.distributed import DistEnv, device_timed
from distnerf.host_buffers import sync_free_paths
from distnerf.sampler import auto_kind
from distnerf.strategy.ddp import DDPStrategy
from distnerf.strategy.sparse_exchange import SparseRule

pytestmark = pytest.mark.cuda  # the whole file: the CUDA switches' own tests (the GPU check runs -m cuda)

PACKAGE = Path(__file__).resolve().parents[2] / "distnerf"
RAW = re.compile(r'type == "cuda"|\.is_cuda|type != "cuda"|cuda\.is_available\(\)')

CEILING = {  # file under distnerf/: (raw device tests at most, what they are)
    "host_buffers.py": (1, "sync_free: the switch"),
    "sampler/__init__.py": (1, "auto_kind: the switch"),
    "components/sample_budget.py": (2, "auto_budget_on: the step path's switch (resolve_samples_per_step, "
                                       "static_by_default); SampleBudget._push: a pinned buffer and an event"),
    "components/step.py": (1, "records_graph: the switch"),
    "distributed/collectives.py": (4, "device_timed: the switch; _checked, _gloo_cuda: the tensors a group takes"),
    "components/optim.py": (1, "Adam's capturable (CUDA only)"),
    "components/graphed_step.py": (1, "GraphedStep.warmup_stream: a CUDA stream"),
    "distributed/env.py": (3, "init_distributed's device (is CUDA there), resolve_device's docstring and error"),
    "distributed/rng.py": (2, "the CUDA generator's state"),
    "engine/late_flag.py": (1, "a pinned buffer and an event"),
    "observe/telemetry.py": (1, "NVML"),
    "observe/run_profiler.py": (2, "the GPU's name and NCCL version; the profiler's CUDA activity"),
    "observe/summary.py": (1, "torch.cuda.max_memory_allocated"),
    "export.py": (1, "the device an export runs on"),
    "sampler/base.py": (1, "pinned memory"),
    "sampler/pipelined.py": (1, "pinned buffers, a copy stream and events"),
    "sampler/device.py": (1, "torch.cuda.mem_get_info"),
    "strategy/ddp.py": (1, "DistributedDataParallel's device_ids"),
}


def test_raw_device_tests_are_the_switches_and_guards_only():
    over = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        found = len(RAW.findall(path.read_text()))
        if found > CEILING.get(rel, (0, ""))[0]:
            over.append(f"distnerf/{rel}: {found} raw device tests, ceiling {CEILING.get(rel, (0, ''))[0]}")
    assert not over, ("a code path chosen by the device goes through a named switch (this module's docstring); a "
                      "guard around a device-only API raises its file's ceiling here, saying what it guards:\n"
                      + "\n".join(over))


def test_the_device_facts_stay_cuda_only_and_sync_free_paths_do_not_move_them():
    for switch in (device_timed, records_graph):
        assert switch("cuda") and switch(torch.device("cuda", 1)) and not switch("cpu")
    assert auto_kind("cuda") == "device" and auto_kind("cuda", "files") == "pipelined"
    assert resolve_samples_per_step(None, None, "cpu") == 0 and resolve_samples_per_step(8, None, "cpu") == 8
    with sync_free_paths():  # the CPU's defaults (the dynamic step, pipelined sampler, host clock) stay
        assert not device_timed("cpu") and not records_graph("cpu")
        assert auto_kind("cpu") == "pipelined" and resolve_samples_per_step(None, None, "cpu") == 0


def test_the_sparse_exchange_follows_sync_free_on_the_cpu():
    """``strategy.sparse_mode=auto`` is ``bounded`` where the code takes the sync-free paths, ``counted`` reads no
    count there (the bucket goes dense), and ``sparse_tables`` is refused there: the CUDA choices, on the CPU."""
    cpu, buffer = DistEnv(), torch.ones(8)
    assert DDPStrategy({"name": "ddp"}, cpu).sparse_mode == "counted"
    assert DDPStrategy({"name": "ddp", "sparse_tables": True}, cpu).cfg.sparse_tables
    assert SparseRule(0, 1.0, "counted").try_sparse((0, 8), buffer)
    with sync_free_paths():
        assert DDPStrategy({"name": "ddp"}, cpu).sparse_mode == "bounded"
        assert DDPStrategy({"name": "ddp", "sparse_mode": "counted"}, cpu).sparse_mode == "counted"
        assert not SparseRule(0, 1.0, "counted").try_sparse((0, 8), buffer)
        with pytest.raises(ConfigError, match="sparse_tables=true is refused"):
            DDPStrategy({"name": "ddp", "sparse_tables": True}, cpu)
    assert DDPStrategy({"name": "ddp"}, DistEnv(device=torch.device("cuda", 0))).sparse_mode == "bounded"
