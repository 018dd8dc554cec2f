"""The pipelined sampler: worker processes build ray batches ahead of the trainer.

Legend: R rays per batch, W workers, K = prefetch slots.

Flow::

    trainer                                   worker w (CPU only, signals ignored)
    start(k0): send (k, k % K) to worker k % W  for k in [k0, k0 + K)
    host_batch(k): recv ("ok", k, slot, seed) --- make_batch(k) -> pack into slots[slot]
    to_device: copy slot out (pinned -> device on a side stream on CUDA), then
               send (k + K, slot) to worker (k + K) % W: the slot is reused;
               if batch k + 1 is already built, start its copy too (it overlaps
               the compute of step k; host_batch(k + 1) then returns it at once)

* Step k is always built by worker ``k % W`` into slot ``k % K`` and consumed in
  step order, and :func:`make_batch` is a pure function of (seed, stream, step), so
  batches are bitwise those of ``sync`` for any W and K.
* Images and cameras are moved into shared memory once and handed to the workers
  at start (or, with ``cache_dir``, the pixels are a memory-mapped file every rank
  and worker maps, see :mod:`.cache`); the K slots are one fixed shared tensor. Per batch only a few integers
  travel through the pipes. The memory is anonymous (``torch`` file-descriptor
  sharing: segments are unlinked at creation), so nothing is left in ``/dev/shm``
  even after a SIGKILL and there are no stale named segments to sweep. On Linux these
  segments are files of ``/dev/shm`` (a tmpfs; Docker gives 64 MB by default): its free
  space is checked before anything is allocated (:func:`check_shared_memory`), and a
  shortfall is an error naming the size needed, the size free and the fixes.
* A worker that raises sends its traceback; one that dies closes its pipe; both
  make ``host_batch`` raise :class:`SamplerWorkerError` at once (liveness is checked
  while waiting). Workers exit when the trainer's end of their pipe closes, and on
  Linux get SIGKILL when their parent dies.
"""
from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import time
import weakref
from dataclasses import replace
from multiprocessing import resource_tracker

import torch
import torch.multiprocessing as mp

from ..data.base import SceneData
from ..config_check import choices_of
from ..schema import SamplerConfig
from .base import BatchSpec, RayBatch, Sampler
from .cache import cached_file, open_pixel_cache, write_pixel_cache
from .files import image_files
from .worker import MAX_IMAGES, SLOT_FLOATS, STOP_SIGNALS, unpack, worker_main

log = logging.getLogger("distnerf")

START_METHODS = choices_of(SamplerConfig, "start_method")


class SamplerWorkerError(RuntimeError):
    """A sampler worker raised, died or stopped answering; the message says which and why."""


class SharedMemoryError(RuntimeError):
    """Too little shared memory (``/dev/shm``) for the pipelined sampler; the message says how much and the fixes."""


SHM_DIR = "/dev/shm"  # where torch's shared tensors live on Linux (shm_open, file_descriptor strategy)


def shm_free_bytes(path: str = SHM_DIR) -> int | None:
    """Bytes an unprivileged process can still allocate in ``path``, or None where it does not
    exist (not Linux) and nothing can be checked."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _shm_fixes(need: int, cache_dir: str | None) -> str:
    gib = max(1, -(-need // 2**30))
    fixes = [f"give the container more shared memory (`docker run --shm-size={gib}g` holds one rank's "
             f"{need / 2**20:.1f} MB, N ranks per machine need N times that; or `docker run --ipc=host`; "
             f"Kubernetes: an emptyDir with `medium: Memory` mounted at {SHM_DIR})"]
    if not cache_dir:
        fixes.append("`sampler.cache_dir=DIR` (the decoded pixels memory-mapped from a file there, on disk; only "
                     "the batch slots stay in shared memory)")
    fixes.append("`sampler=sync` (the trainer builds each batch: no worker processes, no shared memory)")
    return "; ".join(fixes)


def check_shared_memory(tensors: list, slot_bytes: int, cache_dir: str | None = None) -> int:
    """Raise :class:`SharedMemoryError` unless ``/dev/shm`` can hold ``tensors`` (those not
    shared yet) and ``slot_bytes`` of batch slots; return the bytes needed.

    Per rank: every rank on a machine needs as much, and ranks starting together each see
    the space free before the others allocate (an allocation that fails anyway is caught
    by :func:`_share`, with the same message).
    """
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    sizes = [t.numel() * t.element_size() for t in tensors if not t.is_shared()] + [slot_bytes]
    need = sum(-(-n // page) * page for n in sizes)
    free = shm_free_bytes()
    if free is not None and need > free:
        mb = lambda n: f"{n / 2**20:.1f} MB"  # noqa: E731
        raise SharedMemoryError(
            f"the pipelined sampler needs {mb(need)} of shared memory ({SHM_DIR}) for this rank "
            f"({mb(need - slot_bytes)} of images and cameras, {mb(slot_bytes)} of batch slots), but {SHM_DIR} has "
            f"{mb(free)} free (every rank on this machine needs as much). Fixes: {_shm_fixes(need, cache_dir)}")
    return need


def _share(tensor: torch.Tensor, cache_dir: str | None) -> torch.Tensor:
    """``tensor.share_memory_()``, a failure for want of space reported like :func:`check_shared_memory`."""
    try:
        return tensor.share_memory_()
    except RuntimeError as err:
        need = tensor.numel() * tensor.element_size()
        free = shm_free_bytes()
        raise SharedMemoryError(
            f"the pipelined sampler could not put {need / 2**20:.1f} MB into shared memory ({SHM_DIR}: "
            f"{'unknown' if free is None else f'{free / 2**20:.1f} MB'} free; other ranks or processes may have "
            f"taken it since the check): {err}. Fixes: {_shm_fixes(need, cache_dir)}") from err


@contextlib.contextmanager
def _stop_signals_blocked():
    """Block the stop signals (SIGTERM and the preemption signals, :data:`worker.STOP_SIGNALS`)
    while starting processes, which inherit the mask.

    torchrun's agent and Slurm signal a rank's whole process group (or process tree):
    the fork server and resource tracker that multiprocessing starts with the first
    worker would die of it (default action) and take the workers with them. Blocked from
    birth they never see these signals; the trainer alone decides how to stop. A signal
    arriving meanwhile stays pending for the trainer and is handled when the block ends.
    """
    stop = set(STOP_SIGNALS)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    try:
        # the resource tracker unblocks SIGTERM here after starting its process (which ignores
        # SIGTERM and keeps the others blocked): start it first, then block again for the fork server
        resource_tracker.ensure_running()
        signal.pthread_sigmask(signal.SIG_BLOCK, stop)
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _shutdown(procs: list, conns: list, join_s: float = 5.0) -> None:
    """Ask workers to stop, then kill the ones still alive; close the pipes."""
    for conn in conns:
        try:
            conn.send(None)
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + join_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(1.0)
    for conn in conns:
        conn.close()
    for p in procs:
        if hasattr(p, "close") and not p.is_alive():
            p.close()


class PipelinedSampler(Sampler):
    """``num_workers`` processes fill a ring of ``prefetch`` shared-memory batches.

    Args:
        scene: the training split; its images and camera tensors are moved into
            shared memory in place (no copy is kept).
        spec: what to draw (its ray filter must be picklable).
        device: the training device.
        num_workers: W >= 1 worker processes.
        prefetch: K >= 1 batches built ahead (the ring size).
        start_method: ``forkserver`` (workers fork from a server that has imported
            torch once) or ``spawn``; both are safe with CUDA in the trainer.
        timeout_s: longest wait for one batch from a live worker before giving up.
        cache_dir: when given and ``scene.images`` is in RAM, the pixels are written to
            a memory-mapped file there (see :mod:`.cache`) and ``scene.images`` is
            replaced by its read-only mapping. A scene loaded through
            :class:`.cache.PixelCache` already maps its file: workers map the same one. A
            scene loaded through :class:`.files.FileSource` has no pixels: workers get
            its image list and decode the images each batch draws from.
    """

    name = "pipelined"

    def __init__(self, scene: SceneData, spec: BatchSpec, device: torch.device | str,
                 num_workers: int = SamplerConfig.num_workers, prefetch: int = SamplerConfig.prefetch,
                 start_method: str = SamplerConfig.start_method, timeout_s: float = SamplerConfig.timeout_s,
                 cache_dir: str | None = None):
        if len(scene) == 0:
            raise ValueError(f"training split of {scene.source} has no images")
        if len(scene) > MAX_IMAGES:
            raise ValueError(f"sampler=pipelined carries image ids as float32: {len(scene)} training images of "
                             f"{scene.source} exceed {MAX_IMAGES} (use sampler=sync or device)")
        if num_workers < 1 or prefetch < 1:
            raise ValueError(f"sampler.num_workers and sampler.prefetch must be >= 1, got {num_workers}, {prefetch}")
        if start_method not in START_METHODS:
            raise ValueError(f"sampler.start_method must be one of {START_METHODS}, got {start_method!r}")
        super().__init__(spec, device)
        self.num_workers, self.prefetch, self.timeout_s = num_workers, prefetch, float(timeout_s)
        self._num_rays = spec.rays_per_batch
        pixel_cache, worker_scene, files = cached_file(scene.images), scene, image_files(scene.images)
        if pixel_cache is None and files is None and cache_dir:  # decoded into RAM: write them out, map the file
            pixel_cache = str(write_pixel_cache(scene, cache_dir))
            scene.images = open_pixel_cache(pixel_cache)
        share_images = pixel_cache is None and files is None
        cameras = scene.cameras.tensors() + ([scene.mask] if scene.mask is not None else [])
        slot_shape = (prefetch, SLOT_FLOATS * self._num_rays)
        # before any allocation or process: a shortfall is a clear error and leaves nothing behind
        check_shared_memory(([scene.images] if share_images else []) + cameras, 4 * slot_shape[0] * slot_shape[1],
                            cache_dir)
        if share_images:
            _share(scene.images, cache_dir)
        else:  # workers map the file / decode the images themselves
            worker_scene = replace(scene, images=torch.empty((0,) + tuple(scene.images.shape[1:])))
        for t in cameras:
            _share(t, cache_dir)
        self._slots = _share(torch.zeros(slot_shape), cache_dir)
        ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            ctx.set_forkserver_preload(["torch", "distnerf.sampler.worker"])
        parent_pid = os.getpid() if start_method == "spawn" else None
        self._procs, self._conns = [], []
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._conns)  # also on a failed start
        for i in range(num_workers):
            parent_end, child_end = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=worker_main, args=(i, child_end, worker_scene, self._slots, spec, parent_pid,
                                                         pixel_cache, files),
                               name=f"distnerf-sampler-{i}", daemon=True)
            self._conns.append(parent_end)
            try:
                with _stop_signals_blocked():
                    proc.start()
            except (pickle.PicklingError, AttributeError, TypeError) as err:
                child_end.close()
                self.close()
                raise ValueError(f"the pipelined sampler cannot send its workers the ray filter "
                                 f"{spec.ray_filter!r} (it must be picklable: a module-level class or "
                                 f"function): {err}") from err
            child_end.close()  # the worker holds the only other end: its death reads as EOF here
            self._procs.append(proc)
        self.worker_pids = [p.pid for p in self._procs]
        self.worker_cuda_initialised: dict[int, bool] = {}
        self._head = self._issued = None  # next step to consume / to issue; in flight: [head, issued)
        self._held = None  # (step, slot) handed out by host_batch, not yet released by to_device
        self._ahead = None  # (step, device tensor, CUDA event or None, jitter seed): copied ahead
        self._pinned, self._events, self._stream, self._flip = None, None, None, 0

    # ----------------------------------------------------------------- task ring
    def start(self, step: int) -> None:
        """Begin prefetching at ``step`` (dropping any batches built for other steps)."""
        if self._held is None and (self._ahead is not None and self._ahead[0] == step or self._ahead is None
                                   and self._head == step and self._issued == step + self.prefetch):
            return  # already prefetching from ``step``
        self._held = self._ahead = None
        if self._head is not None:
            for k in range(self._head, self._issued):  # let in-flight work finish, discard it
                self._receive(k)
        self._head = self._issued = step
        for _ in range(self.prefetch):
            self._issue()

    def _issue(self) -> None:
        step = self._issued
        self._send(step % self.num_workers, (step, step % self.prefetch))
        self._issued += 1

    def _send(self, worker: int, msg) -> None:
        try:
            self._conns[worker].send(msg)
        except (OSError, ValueError) as err:
            self._fail(worker, f"cannot send a task ({err})")

    def _poll(self, step: int, timeout: float = 0.0):
        """Worker ``step % W``'s answer ``("ok", step, slot, seed)`` if it arrives within ``timeout`` s, else None."""
        worker = step % self.num_workers
        conn = self._conns[worker]
        try:
            while conn.poll(timeout):
                msg = conn.recv()
                if msg[0] == "ready":
                    self.worker_cuda_initialised[msg[1]] = msg[3]
                    continue
                if msg[0] == "error":
                    self._fail(msg[1], "raised an exception", msg[2])
                assert msg[0] == "ok" and msg[1] == step, (msg, step)
                return msg
        except (EOFError, OSError):
            self._fail(worker, "closed its pipe")
        return None

    def _receive(self, step: int) -> tuple:
        """Wait for worker ``step % W``'s answer for ``step``, watching every worker's health."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            msg = self._poll(step, 0.05)
            if msg is not None:
                return msg
            for i, proc in enumerate(self._procs):
                if proc.exitcode is not None:
                    self._fail(i, f"exited with code {proc.exitcode}")
            if time.monotonic() > deadline:
                self._fail(step % self.num_workers,
                           f"sent no batch for step {step} in sampler.timeout_s={self.timeout_s} s")

    def _fail(self, worker: int, what: str, detail: str | None = None):
        """Raise the error of ``worker`` (its traceback if it sent one) after stopping every worker."""
        conn = self._conns[worker]
        if detail is None:  # a worker that raised then exited: prefer its own report
            try:
                while conn.poll(0):
                    msg = conn.recv()
                    if msg[0] == "error":
                        what, detail = "raised an exception", msg[2]
            except (EOFError, OSError):
                pass
        pid = self.worker_pids[worker]
        self.close()
        text = f"sampler worker {worker} (pid {pid}) {what}"
        raise SamplerWorkerError(text + (f":\n{detail}" if detail else ""))

    # ----------------------------------------------------------------- interface
    def host_batch(self, step: int) -> RayBatch:
        """The batch of ``step``: a view of its shared slot, valid until ``to_device`` (or,
        when it was copied ahead, already on the device)."""
        if not self._finalizer.alive:
            raise SamplerWorkerError("the pipelined sampler is closed")
        if self._held is not None:
            self._release()
        self.next_step = step + 1
        if self._ahead is not None and self._ahead[0] == step:
            _, out, event, jitter_seed, count = self._ahead
            self._ahead = None
            return self._hand_out(out, event, jitter_seed, count)
        self.start(step)
        _, _, slot, jitter_seed = self._receive(step)
        self._head += 1
        self._held = (step, slot)
        return unpack(self._slots[slot], self._num_rays, jitter_seed)

    def _release(self) -> None:
        step, slot = self._held
        self._held = None
        assert self._issued == step + self.prefetch and self._issued % self.prefetch == slot
        self._issue()

    def to_device(self, batch: RayBatch) -> RayBatch:
        """The batch on the device; its slot goes back to the workers. Then, if the next
        batch is already built, its copy starts too (on CUDA on the side stream, so it
        overlaps this step's compute)."""
        if self._held is not None:
            count = batch.host_valid_count()  # the slot's view: counted on the host before the copy
            out, event = self._copy_out(self._slots[self._held[1]])
            self._release()
            batch = self._hand_out(out, event, batch.jitter_seed, count)
        # else: copied ahead during the previous step, already on the device
        self._copy_ahead(self.next_step)
        return batch

    def _copy_ahead(self, step: int) -> None:
        """Start copying batch ``step`` out of its slot if a worker has finished it (never waits)."""
        if self._ahead is not None or self._head != step:
            return
        msg = self._poll(step)
        if msg is None:
            return
        _, _, slot, jitter_seed = msg
        self._head += 1
        count = unpack(self._slots[slot], self._num_rays, jitter_seed).host_valid_count()
        out, event = self._copy_out(self._slots[slot])
        self._held = (step, slot)
        self._release()
        self._ahead = (step, out, event, jitter_seed, count)

    def _copy_out(self, slot: torch.Tensor):
        """``(copy of slot on the device, CUDA event of the copy or None)``."""
        if self.device.type != "cuda":
            return slot.clone(), None
        if self._pinned is None:
            self._pinned = [torch.empty_like(slot).pin_memory() for _ in range(2)]
            self._events = [None, None]
            self._stream = torch.cuda.Stream(self.device)
        i, self._flip = self._flip, 1 - self._flip
        if self._events[i] is not None:
            self._events[i].synchronize()  # the copy that last read this pinned buffer is done
        self._pinned[i].copy_(slot)
        with torch.cuda.stream(self._stream):
            out = self._pinned[i].to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        self._events[i] = event
        return out, event

    def _hand_out(self, out: torch.Tensor, event, jitter_seed: int, num_valid: float | None) -> RayBatch:
        if event is not None:
            main = torch.cuda.current_stream(self.device)
            main.wait_event(event)  # compute on the batch starts after its copy (no host wait)
            out.record_stream(main)  # allocated on the side stream, used on the main one
        return replace(unpack(out, self._num_rays, jitter_seed), num_valid=num_valid)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "num_workers": self.num_workers, "prefetch": self.prefetch}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.start(self.next_step)

    def close(self) -> None:
        """Stop the workers (kill after 5 s) and drop the shared buffers; idempotent."""
        if self._finalizer.alive:
            self._finalizer()
        self._slots = self._pinned = None
