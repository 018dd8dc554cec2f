"""A decoded, memory-mapped pixel cache on disk, shared by every rank and worker.

Legend: N images, H, W image size.

``sampler.cache_dir`` keeps the decoded training pixels in one ``.npy`` file there,
mapped read-only by every rank and every sampler worker: one page-cache copy that
the kernel can evict under memory pressure, so datasets larger than memory train.

* **Built once, image by image.** The trainer passes :class:`PixelCache` to
  ``load_scene`` as its ``pixels`` hook: the parser's image list is decoded one image
  at a time (a few threads), each written at its place in a preallocated ``.npy``
  file (:class:`NpyWriter`), so the decoded split is never held in RAM, not even as
  mapped pages of the process. The file is named by a fingerprint of the
  files (resolved path, size, mtime) and of the decoding recipe (parser, background,
  downscale), so later runs reuse it without decoding anything.
* **Atomic.** It is written under a temporary name ``<name>.<pid>.tmp`` and renamed
  into place; torn temporaries of dead writers are swept.
* **One builder.** Concurrent builders (several ranks on one host, or runs sharing
  the directory) serialise on an ``flock`` of ``<name>.lock``: the first builds, the
  others wait and then map its file. The kernel drops the lock when a builder dies,
  so a waiter then builds instead (no hang). ``flock`` must work on the file system
  of ``cache_dir`` (local disks do; on NFS/Lustre use a node-local directory).
* **Checked.** A cache file whose header, dtype, shape or size is wrong (truncated,
  overwritten) is rebuilt with a warning naming it; :func:`open_pixel_cache` refuses
  such a file with an error naming it.

Scenes already decoded into RAM (built in memory, or loaded without the hook) go
through :func:`write_pixel_cache`, keyed by a digest of their pixels.
"""
from __future__ import annotations

import hashlib
import logging
import os
import sys
import time
import warnings
import weakref
from pathlib import Path
from typing import Callable

import numpy as np
import numpy.lib.format as npy_format
import torch

from ..fileio import exclusive_lock
from ..data.base import DatasetError, SceneData
from ..data.images import ImageList

log = logging.getLogger("distnerf")

FORMAT_VERSION = 1  # bump when the decoded content of a recipe changes
EVERY_RANK = {"every_rank": True}  # log extra: on the console of whichever rank builds (distnerf.rundir.setup_logging)
_MAPPED: dict[int, tuple] = {}  # id(tensor) -> (weakref to the tensor, cache file)


class PixelCache:
    """The ``pixels`` hook of ``load_scene`` that streams decoded images into ``cache_dir``.

    ``PixelCache(dir)(image_list)`` returns the split's pixels as a read-only memory-mapped
    (N, H, W, 3) float32 tensor of ``dir/pixels-<fingerprint>.npy``, building the file
    first if it is missing or damaged (see the module docstring).

    Args:
        cache_dir: directory of the cache files (created if needed).
        num_threads: decoding threads while building (default ``min(16, cpu count)``);
            at most this many decoded images are in RAM at once.
        progress_every_s: while building, a log line every this many seconds (images done,
            images/s, ETA; a tqdm bar instead when stderr is a terminal), so a set of thousands
            of frames never sits at start without output.
    """

    def __init__(self, cache_dir: str | Path, num_threads: int | None = None, progress_every_s: float = 10.0):
        self.cache_dir, self.num_threads, self.progress_every_s = Path(cache_dir), num_threads, progress_every_s

    def path_for(self, images: ImageList) -> Path:
        """The cache file of ``images`` (no decoding; one ``stat`` per image file)."""
        return self.cache_dir / f"pixels-{images.fingerprint()}-v{FORMAT_VERSION}.npy"

    def __call__(self, images: ImageList) -> torch.Tensor:
        if len(images) == 0:
            raise ValueError("cannot cache an empty image list")

        def build(tmp: Path) -> None:
            shape, first = images.first()
            with NpyWriter(tmp, shape) as out, DecodeProgress(len(images), self.progress_every_s) as progress:
                images.decode_into(out, first, self.num_threads, progress)

        path = self.path_for(images)
        ensure_pixel_file(path, build, len(images), f"{len(images)} images from {Path(images.paths[0]).parent}")
        return open_pixel_cache(path)

    def __repr__(self) -> str:
        return f"PixelCache({str(self.cache_dir)!r})"


class DecodeProgress:
    """Progress of a cache build: ``progress(done)`` after each decoded image.

    On a terminal, a tqdm bar (images/s, ETA); otherwise (Slurm logs, pipes) a log line every
    ``every_s`` seconds, with tqdm's own meter text (``done/total [elapsed<ETA, rate]``), and
    one at the end.

    Args:
        total: images to decode. every_s: seconds between log lines (> 0).
    """

    def __init__(self, total: int, every_s: float = 10.0):
        from tqdm import tqdm

        self.total, self.every_s, self._tqdm = int(total), float(every_s), tqdm
        self.bar = tqdm(total=self.total, unit="img", desc="pixel cache", dynamic_ncols=True) \
            if sys.stderr.isatty() else None
        self.start = time.monotonic()
        self._next = self.start + self.every_s
        self.done = 0

    def meter(self) -> str:
        return self._tqdm.format_meter(self.done, self.total, time.monotonic() - self.start, unit="img",
                                       bar_format="{n_fmt}/{total_fmt} images [{elapsed}<{remaining}, {rate_fmt}]")

    def __call__(self, done: int) -> None:
        if self.bar is not None:
            self.bar.update(done - self.done)
        self.done = done
        if self.bar is None and time.monotonic() >= self._next:
            log.info("pixel cache: decoded %s", self.meter(), extra=EVERY_RANK)
            self._next = time.monotonic() + self.every_s

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()
        if exc[0] is None:
            log.info("pixel cache: decoded %s", self.meter(), extra=EVERY_RANK)


class NpyWriter:
    """A preallocated ``.npy`` file of float32 images written in place, image by image.

    ``out[index] = image`` writes image ``index`` at its offset with ``os.pwrite`` (safe
    from several threads, in any order). Nothing is mapped: the written pages go to the
    kernel's page cache (written back and evicted under memory pressure), not to this
    process's resident memory, so building a cache larger than RAM works.

    Args:
        path: the file to create (truncated).
        shape: (N, H, W, 3) of the array.
    """

    def __init__(self, path: Path, shape: tuple):
        self.path, self.shape = Path(path), tuple(int(n) for n in shape)
        self._image_bytes = int(np.prod(self.shape[1:])) * 4
        with open(self.path, "wb") as f:
            npy_format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": self.shape})
            self._offset = f.tell()
            f.truncate(self._offset + self.shape[0] * self._image_bytes)  # sparse until written
        self._fd = os.open(self.path, os.O_WRONLY)

    def __setitem__(self, index: int, image: np.ndarray) -> None:
        data = np.ascontiguousarray(image, dtype="<f4")
        assert data.shape == self.shape[1:], (data.shape, self.shape)
        view, offset = memoryview(data).cast("B"), self._offset + int(index) * self._image_bytes
        while view:  # pwrite may write less than asked
            written = os.pwrite(self._fd, view, offset)
            view, offset = view[written:], offset + written

    def close(self) -> None:
        """fsync and close (idempotent)."""
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def pixel_digest(images: torch.Tensor) -> str:
    """sha256 (hex, 16 chars) of the shape, dtype and bytes of ``images``."""
    array = images.contiguous().numpy()
    h = hashlib.sha256(f"{array.shape}{array.dtype}".encode())
    flat = array.reshape(-1).view(np.uint8)
    for start in range(0, flat.size, 1 << 26):
        h.update(flat[start:start + (1 << 26)])
    return h.hexdigest()[:16]


def write_pixel_cache(scene: SceneData, cache_dir: str | Path) -> Path:
    """The cache file of ``scene.images`` ((N, H, W, 3) float32, already in RAM), written once.

    Keyed by a digest of the pixels; same atomic, single-builder write as :class:`PixelCache`.
    """
    cache_dir = Path(cache_dir)
    path = cache_dir / f"pixels-{scene.split}-{pixel_digest(scene.images)}.npy"
    source = scene.images.contiguous().numpy()

    def build(tmp: Path) -> None:
        with NpyWriter(tmp, source.shape) as out:
            for index, image in enumerate(source):
                out[index] = image

    ensure_pixel_file(path, build, len(scene), f"{scene.split} split of {scene.source}")
    return path


class PixelCacheWriteError(DatasetError):
    """The pixel cache could not be written (names the file and the cause)."""


def ensure_pixel_file(path: Path, build: Callable[[Path], None], num_images: int, what: str) -> None:
    """Make ``path`` a valid cache file of ``num_images`` images, building it if needed.

    Args:
        path: the cache file.
        build: ``build(tmp)`` writes the complete file at ``tmp`` and fsyncs it.
        num_images: N expected in the file.
        what: the images, for log messages.
    Raises:
        PixelCacheWriteError: the file could not be written (disk full, a file-size limit); the
            temporary file is removed, so no partial cache is ever mapped.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(path.parent)  # torn temporaries of dead writers (live writers' are kept)
    if check_pixel_file(path, num_images) is None:
        return  # built by an earlier run or rank
    with exclusive_lock(path.with_name(path.name + ".lock")):
        problem = check_pixel_file(path, num_images)
        if problem is None:
            return  # another builder finished while we waited
        if path.exists():
            log.warning("pixel cache %s %s: rebuilding it", path, problem)
            path.unlink()
        log.info("building the pixel cache %s (%s, decoded image by image)", path, what, extra=EVERY_RANK)
        start = time.monotonic()
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            build(tmp)
            problem = check_pixel_file(tmp, num_images)
            if problem is not None:
                raise RuntimeError(f"the pixel cache just written at {tmp} {problem}")
            os.replace(tmp, path)
        except OSError as err:  # disk full, a file-size limit: named, and nothing partial is kept or mapped
            raise PixelCacheWriteError(f"could not write the pixel cache {path} ({what}): "
                                       f"{err.strerror or err}; nothing partial was kept. Free space in "
                                       f"{path.parent}, or train without sampler.cache_dir") from err
        finally:
            tmp.unlink(missing_ok=True)
        log.info("pixel cache %s built in %.1f s", path, time.monotonic() - start, extra=EVERY_RANK)


def check_pixel_file(path: str | Path, num_images: int | None = None) -> str | None:
    """What is wrong with the cache file ``path``, or None if it is a complete cache.

    Complete: a version 1 or 2 ``.npy`` header of a C-ordered little-endian float32
    (N, H, W, 3) array (N = ``num_images`` when given) and exactly the header plus
    N * H * W * 3 * 4 bytes.

    Returns:
        None, or a phrase such as ``"is missing"``, ``"is truncated (...)"``.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            version = npy_format.read_magic(f)
            if version not in ((1, 0), (2, 0)):
                raise ValueError(f".npy format version {version}")
            read_header = npy_format.read_array_header_1_0 if version == (1, 0) else npy_format.read_array_header_2_0
            shape, fortran, dtype = read_header(f)
            offset = f.tell()
    except FileNotFoundError:
        return "is missing"
    except (OSError, ValueError, SyntaxError, TypeError) as err:
        return f"has no valid .npy header ({err})"
    if dtype != np.dtype("<f4") or fortran or len(shape) != 4 or shape[-1] != 3:
        return f"holds a {'Fortran' if fortran else 'C'}-ordered {dtype} array of shape {shape}, not (N, H, W, 3) float32"
    if num_images is not None and shape[0] != num_images:
        return f"holds {shape[0]} images, not {num_images}"
    expected = offset + int(np.prod(shape)) * 4
    if size != expected:
        return f"is truncated or padded ({size} bytes, expected {expected} for shape {shape})"
    return None


def sweep_stale(cache_dir: Path) -> list[Path]:
    """Remove ``pixels-*.<pid>.tmp`` files of writers that died (pid no longer alive on this host)."""
    removed = []
    for tmp in Path(cache_dir).glob("pixels-*.tmp"):
        try:
            pid = int(tmp.name.rsplit(".", 2)[-2])
            os.kill(pid, 0)
        except ValueError:
            continue
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
        except PermissionError:
            continue  # alive, another user's
    return removed


def open_pixel_cache(path: str | Path) -> torch.Tensor:
    """The cached pixels as a read-only memory-mapped (N, H, W, 3) float32 tensor (never written).

    Raises:
        ValueError: ``path`` is not a complete cache file (names it and what is wrong).
    """
    problem = check_pixel_file(path)
    if problem is not None:
        raise ValueError(f"pixel cache {path} {problem}; delete it to have it rebuilt")
    array = np.load(path, mmap_mode="r")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns about non-writable arrays
        tensor = torch.from_numpy(array)
    _MAPPED[id(tensor)] = (weakref.ref(tensor, lambda _, key=id(tensor): _MAPPED.pop(key, None)), str(path))
    return tensor


def cached_file(images: torch.Tensor) -> str | None:
    """The cache file ``images`` maps, when it is a tensor returned by :func:`open_pixel_cache`."""
    entry = _MAPPED.get(id(images))
    return entry[1] if entry is not None and entry[0]() is images else None
