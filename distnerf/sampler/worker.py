"""The pipelined sampler's worker process and the shared slot layout.

Legend: R rays per batch.

A slot is one flat float32 shared-memory tensor of ``SLOT_FLOATS * R`` values::

    [origins 3R | directions 3R | viewdirs 3R | near R | far R | rgb 3R | valid R | image_ids R]

so a batch is one contiguous block (one host-to-device copy) whose fields are
contiguous views (the training image ids travel as float32, exact below 2^24 images:
:data:`MAX_IMAGES`). Workers run on the CPU only: they never touch CUDA.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import traceback

import torch

from ..data.base import SceneData
from ..data.images import ImageList
from ..data.rays import RayBundle
from .base import BatchSpec, RayBatch, make_batch
from .cache import open_pixel_cache
from .files import FilePixels

SLOT_FLOATS = 16
_FIELDS = (("origins", 3), ("directions", 3), ("viewdirs", 3), ("near", 1), ("far", 1), ("rgb", 3),
           ("valid", 1), ("image_ids", 1))
MAX_IMAGES = 1 << 24  #: image ids a float32 slot holds exactly


def _views(flat: torch.Tensor, num_rays: int) -> dict:
    out, offset = {}, 0
    for name, width in _FIELDS:
        view = flat[offset * num_rays:(offset + width) * num_rays]
        out[name] = view.view(num_rays, width) if width > 1 else view
        offset += width
    return out


def pack(batch: RayBatch, slot: torch.Tensor) -> None:
    """Write ``batch`` into ``slot``: (SLOT_FLOATS * R,) float32 (bit-exact copy of every field)."""
    views = _views(slot, len(batch.rgb))
    for name in ("origins", "directions", "viewdirs", "near", "far"):
        views[name].copy_(getattr(batch.rays, name))
    views["rgb"].copy_(batch.rgb)
    views["valid"].copy_(batch.valid)
    views["image_ids"].copy_(batch.rays.image_ids)


def unpack(slot: torch.Tensor, num_rays: int, jitter_seed: int) -> RayBatch:
    """The batch held by ``slot`` (views into it; ``valid`` back to bool, ``image_ids`` to int64)."""
    views = _views(slot, num_rays)
    rays = RayBundle(views["origins"], views["directions"], views["viewdirs"], views["near"], views["far"],
                     views["image_ids"].long())
    return RayBatch(rays, views["rgb"], views["valid"] > 0.5, jitter_seed)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
"""Signals a launcher may send a rank's whole process group to stop it (SIGTERM, and each
preemption signal ``launch/`` may be configured with): the trainer handles them, workers never."""


def _detach_from_parent() -> None:
    """Ignore the signals the trainer handles (it decides how to stop) and die with the parent."""
    for sig in (signal.SIGINT, *STOP_SIGNALS):
        signal.signal(sig, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:  # PR_SET_PDEATHSIG = 1: SIGKILL when the parent exits
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the closed pipe still ends the worker at its next receive


def worker_main(worker_id: int, conn, scene: SceneData, slots: torch.Tensor, spec: BatchSpec,
                parent_pid: int | None, pixel_cache: str | None = None, files: ImageList | None = None) -> None:
    """Serve ``(step, slot)`` tasks from ``conn`` until ``None`` or the parent's end closes.

    Each task builds the batch of ``step`` with :func:`make_batch` into ``slots[slot]``
    and answers ``("ok", step, slot, jitter_seed)``; an exception answers
    ``("error", worker_id, traceback)`` and ends the worker.

    Args:
        worker_id: index of this worker.
        conn: this worker's end of its duplex pipe to the trainer.
        scene: the training split; its images and cameras are shared-memory tensors
            (images empty when ``pixel_cache`` is given).
        slots: (prefetch, SLOT_FLOATS * R) float32 shared-memory ring.
        spec: what to draw.
        parent_pid: the trainer's pid under ``spawn`` (exit if already re-parented);
            ``None`` under ``forkserver`` (the parent is the fork server).
        pixel_cache: path of the memory-mapped pixel cache to read instead of ``scene.images``.
        files: the image list to decode each batch's images from (``sampler.source=files``).
    """
    _detach_from_parent()
    if parent_pid is not None and os.getppid() != parent_pid:
        return
    torch.set_num_threads(1)
    if files is not None:
        flat_rgb = FilePixels(files, scene.height, scene.width)
    else:
        flat_rgb = (open_pixel_cache(pixel_cache) if pixel_cache else scene.images).reshape(-1, 3)
    conn.send(("ready", worker_id, os.getpid(), torch.cuda.is_initialized()))
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return  # the trainer closed its end or died
        if task is None:
            return
        step, slot = task
        try:
            batch = make_batch(spec, scene, flat_rgb, step)
            pack(batch, slots[slot])
            conn.send(("ok", step, slot, batch.jitter_seed))
        except BaseException:  # noqa: BLE001 - reported to the trainer, which raises it
            with contextlib.suppress(OSError):
                conn.send(("error", worker_id, f"step {step}: {traceback.format_exc()}"))
            return
