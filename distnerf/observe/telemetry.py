"""Background telemetry: accelerator (NVML) and process (psutil) samples.

NVML (``nvidia-ml-py``) is used only where it initialises and the training device
is CUDA; on CPU-only machines nothing is sampled there and nothing is raised. The
process side (CPU %, resident memory) uses psutil when it is installed.
"""
from __future__ import annotations

import logging
import threading
import time

import numpy as np
import torch

log = logging.getLogger("distnerf")


def _nvml_handle(device: torch.device):
    """(pynvml module, handle) of ``device``, or (None, reason) when NVML is not usable."""
    if device.type != "cuda":
        return None, "device is not CUDA"
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as err:  # not installed, no driver: telemetry simply has no accelerator part
        return None, f"NVML unavailable: {err}"
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        return pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception:
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)


class Telemetry:
    """Samples every ``interval_s`` seconds on a daemon thread until :meth:`stop`.

    Each sample: ``t`` (s since start), ``cpu_percent`` (this process, 100 = one core),
    ``rss_mb``; with NVML also ``gpu_util`` (%), ``gpu_mem_mb``, ``sm_clock_mhz``, ``power_w``.

    Args:
        device: the training device. interval_s: seconds between samples (> 0).
    Raises:
        ValueError: ``interval_s`` not positive.
    """

    def __init__(self, device: torch.device, interval_s: float = 1.0):
        if interval_s <= 0:
            raise ValueError(f"profiler.telemetry_interval_s must be > 0, got {interval_s}")
        self.interval_s = float(interval_s)
        self.samples: list[dict] = []
        self.nvml, self.handle = _nvml_handle(device)
        self.nvml_reason = None if self.nvml is not None else self.handle
        try:
            import psutil

            self.process = psutil.Process()
            self.process.cpu_percent(None)  # first call primes the counter
        except ImportError:
            self.process = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="distnerf-telemetry", daemon=True)
        self._start = time.perf_counter()

    def start(self) -> "Telemetry":
        self._thread.start()
        return self

    def sample(self) -> dict:
        row = {"t": time.perf_counter() - self._start}
        if self.process is not None:
            row["cpu_percent"] = self.process.cpu_percent(None)
            row["rss_mb"] = self.process.memory_info().rss / 2**20
        if self.nvml is not None:
            n, h = self.nvml, self.handle
            try:
                row["gpu_util"] = n.nvmlDeviceGetUtilizationRates(h).gpu
                row["gpu_mem_mb"] = n.nvmlDeviceGetMemoryInfo(h).used / 2**20
                row["sm_clock_mhz"] = n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)
                row["power_w"] = n.nvmlDeviceGetPowerUsage(h) / 1000.0
            except Exception as err:  # a query unsupported on this board: keep the rest
                row["nvml_error"] = str(err)
        return row

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append(self.sample())

    def stop(self) -> dict:
        """Stop sampling; return ``{"samples", "summary": {key: {mean, max}}, "nvml"}``."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5 * self.interval_s + 1)
        self.samples.append(self.sample())
        summary = {}
        for key in ("cpu_percent", "rss_mb", "gpu_util", "gpu_mem_mb", "sm_clock_mhz", "power_w"):
            values = [s[key] for s in self.samples if key in s]
            if values:
                summary[key] = {"mean": float(np.mean(values)), "max": float(np.max(values))}
        return {"interval_s": self.interval_s, "nvml": self.nvml_reason or "sampled", "summary": summary,
                "samples": self.samples}
