"""A decoded, memory-mapped pixel cache on disk, shared by every rank and worker.

Legend: N images, H, W image size.

``sampler.cache_dir`` makes the pipelined sampler write the training pixels once
as ``pixels-<split>-<digest>.npy`` (content digest, so runs and ranks on one machine
reuse the same file) and map it read-only: all ranks and their workers then share
one page-cache copy that the kernel can evict under memory pressure, instead of one
shared-memory copy per rank.
"""
from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

import numpy as np
import torch

from ..data.base import SceneData


def pixel_digest(images: torch.Tensor) -> str:
    """sha256 (hex, 16 chars) of the shape, dtype and bytes of ``images``."""
    array = images.contiguous().numpy()
    h = hashlib.sha256(f"{array.shape}{array.dtype}".encode())
    flat = array.reshape(-1).view(np.uint8)
    for start in range(0, flat.size, 1 << 26):
        h.update(flat[start:start + (1 << 26)])
    return h.hexdigest()[:16]


def write_pixel_cache(scene: SceneData, cache_dir: str | Path) -> Path:
    """The cache file of ``scene.images`` ((N, H, W, 3) float32), written once (atomic rename)."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    sweep_stale(cache_dir)
    path = cache_dir / f"pixels-{scene.split}-{pixel_digest(scene.images)}.npy"
    if not path.exists():
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            np.save(f, scene.images.contiguous().numpy())
        os.replace(tmp, path)  # ranks racing here write identical bytes
    return path


def sweep_stale(cache_dir: Path) -> list[Path]:
    """Remove ``pixels-*.<pid>.tmp`` files of writers that died (pid no longer alive on this host)."""
    removed = []
    for tmp in cache_dir.glob("pixels-*.tmp"):
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
    """The cached pixels as a read-only memory-mapped (N, H, W, 3) float32 tensor (never written)."""
    array = np.load(path, mmap_mode="r")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns about non-writable arrays
        return torch.from_numpy(array)
