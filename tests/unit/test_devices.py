"""NVML telemetry finds the physical device of torch's ``cuda:N`` through ``CUDA_VISIBLE_DEVICES``
(distnerf.observe.telemetry), with fake environment values and a fake NVML: no GPU needed."""
from __future__ import annotations

import sys
import types

import pytest
import torch

from distnerf.observe import telemetry
from distnerf.observe.telemetry import visible_device

UUIDS = ["GPU-aaaa1111-0000", "GPU-bbbb2222-0000", "GPU-cccc3333-0000", "GPU-dddd4444-0000"]


@pytest.mark.parametrize("index, visible, expected", [
    (0, None, 0), (3, None, 3),                        # unset: NVML's own numbering
    (0, "2,3", 2), (1, "2,3", 3), (0, " 1 , 0", 1),     # listed order, spaces ignored
    (0, "3,1,-1,0", 3), (1, "3,1,-1,0", 1),            # the list ends at the first invalid entry
    (0, "GPU-bbbb2222-0000", "GPU-bbbb2222-0000"), (1, "0,GPU-cccc", "GPU-cccc"),
    (0, "MIG-1234-5678", "MIG-1234-5678"),
])
def test_visible_device_maps_torch_index_to_nvml(index, visible, expected):
    assert visible_device(index, visible) == expected


@pytest.mark.parametrize("index, visible", [(0, ""), (0, "-1"), (2, "0,1"), (1, "0,nope,1"), (0, "GPU-")])
def test_visible_device_not_visible_is_a_clear_error(index, visible):
    with pytest.raises(ValueError, match="is not visible: CUDA_VISIBLE_DEVICES="):
        visible_device(index, visible)


@pytest.fixture
def fake_nvml(monkeypatch):
    """A pynvml module with four devices (handles are their physical indices); torch reports no UUID."""
    nvml = types.ModuleType("pynvml")
    nvml.nvmlInit = lambda: None
    nvml.nvmlDeviceGetCount = lambda: len(UUIDS)
    nvml.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    nvml.nvmlDeviceGetUUID = lambda h: UUIDS[h[1]].encode()  # older bindings return bytes

    def by_uuid(uuid):
        if uuid not in UUIDS:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return ("handle", UUIDS.index(uuid))

    nvml.nvmlDeviceGetHandleByUUID = by_uuid
    monkeypatch.setitem(sys.modules, "pynvml", nvml)

    def no_uuid(_index):
        raise AttributeError("no uuid in this torch")

    monkeypatch.setattr(torch.cuda, "get_device_properties", no_uuid)
    return nvml


@pytest.mark.cuda
@pytest.mark.parametrize("visible, index, physical", [
    (None, 1, 1), ("2,3", 0, 2), ("3,0", 1, 0), ("GPU-cccc3333-0000", 0, 2), ("0,GPU-dddd", 1, 3),
])
def test_nvml_handle_follows_cuda_visible_devices(fake_nvml, monkeypatch, visible, index, physical):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    nvml, handle = telemetry._nvml_handle(torch.device("cuda", index))
    assert nvml is fake_nvml and handle == ("handle", physical)


def test_nvml_handle_of_an_invisible_device_is_a_reason_not_an_exception(fake_nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    nvml, reason = telemetry._nvml_handle(torch.device("cuda", 1))
    assert nvml is None and "CUDA_VISIBLE_DEVICES='1'" in reason and "not visible" in reason


def test_nvml_handle_prefers_torch_uuid(fake_nvml, monkeypatch):
    class Props:
        uuid = "dddd4444-0000"  # torch prints the UUID without the GPU- prefix

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _i: Props())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # would say physical 0: the UUID wins
    assert telemetry._nvml_handle(torch.device("cuda", 0))[1] == ("handle", 3)


def test_cpu_device_has_no_nvml():
    assert telemetry._nvml_handle(torch.device("cpu")) == (None, "device is not CUDA")


# ----------------------------------------------------------------------------- device=auto
from distnerf.distributed.env import resolve_device  # noqa: E402


@pytest.mark.parametrize("device, cuda, environ, expected", [
    pytest.param("auto", True, {"SLURM_JOB_ID": "7", "WORLD_SIZE": "8"}, "cuda", marks=pytest.mark.cuda),
    ("auto", False, {}, "cpu"),                               # a plain process on a laptop
    ("auto", False, {"WORLD_SIZE": "1", "RANK": "0"}, "cpu"),  # a one-rank torchrun
    ("cpu", False, {"SLURM_JOB_ID": "7", "WORLD_SIZE": "2"}, "cpu"),  # asked for: no refusal
    ("cpu", True, {"WORLD_SIZE": "2"}, "cpu"),
    pytest.param("cuda", True, {}, "cuda", marks=pytest.mark.cuda),
])
def test_resolve_device(device, cuda, environ, expected):
    assert resolve_device(device, cuda, environ) == expected


@pytest.mark.parametrize("environ, why", [
    ({"SLURM_JOB_ID": "4242"}, "in Slurm job 4242"),
    ({"WORLD_SIZE": "2", "RANK": "1"}, "as one of 2 torchrun ranks"),
    ({"SLURM_JOB_ID": "9", "WORLD_SIZE": "16"}, "in Slurm job 9 and as one of 16 torchrun ranks"),
])
def test_auto_refuses_the_cpu_in_a_job_and_says_why(environ, why):
    with pytest.raises(ValueError, match="device=auto found no CUDA device") as err:
        resolve_device("auto", False, {**environ, "CUDA_VISIBLE_DEVICES": ""})
    assert why in str(err.value) and "pass device=cpu" in str(err.value) and "CUDA_VISIBLE_DEVICES=''" in str(err.value)


@pytest.mark.cuda
def test_cuda_without_cuda_is_refused():
    with pytest.raises(ValueError, match="device=cuda requested"):
        resolve_device("cuda", False, {})


def test_train_refuses_auto_on_cpu_ranks_before_joining(monkeypatch):
    """The entry point's own path (init_distributed) refuses before any rendezvous."""
    from distnerf.distributed.env import init_distributed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("SLURM_JOB_ID", "31")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match="in Slurm job 31"):
        init_distributed("auto", timeout_s=10, setup_timeout_s=None)
    assert init_distributed("cpu", timeout_s=10, setup_timeout_s=None).device == torch.device("cpu")


@pytest.mark.cuda
def test_ddp_refuses_sparse_tables_on_cuda_at_build_time():
    """strategy.sparse_tables on CUDA is refused when the strategy is built (before any model or device
    work), with the reason; on the CPU the same config builds."""
    from distnerf.config_check import ConfigError
    from distnerf.distributed import DistEnv
    from distnerf.strategy.ddp import DDPStrategy

    cfg = {"name": "ddp", "sparse_tables": True}
    with pytest.raises(ConfigError, match=r"sparse_tables=true is refused on CUDA: .*host read per table per step"):
        DDPStrategy(cfg, DistEnv(device=torch.device("cuda", 0)))
    assert DDPStrategy(cfg, DistEnv()).cfg.sparse_tables
    assert not DDPStrategy({"name": "ddp"}, DistEnv(device=torch.device("cuda", 0))).cfg.sparse_tables
