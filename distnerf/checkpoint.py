"""Atomic, multi-rank checkpoints with a manifest as the commit marker.

Layout of one checkpoint (every name is defined here, once)::

    RUN/checkpoints/step_00001000/
        model.pt               ddp: the model + optimizer + step (the main rank; replicas are identical)
        region_000.pt ...      ss: one sub-model and its optimizer state per region (written by its owner)
        optimizer_rank_0.pt    ss, format 3: each rank's optimizer over its regions (read, see below)
        rank_0.pt ...          every rank: RNG states and sampler state
        manifest.json          rank 0, after a barrier, through a temp file + rename; holds
                               ``format`` (:data:`FORMAT_VERSION`), the file list with checksums,
                               the config hashes and the strategy's facts

Every ``.pt`` file holds data only (tensors, numbers, strings, lists and dicts of them:
model and optimizer states, RNG states as tensors, plain-container configs) and is read
with ``torch.load(..., weights_only=True)`` (:func:`load_file`), so loading a shared run
directory never executes pickled code.

Formats. :data:`FORMAT_VERSION` changes whenever the layout or the meaning of a recorded
figure does. An older format this distnerf still reads has a named converter in
:data:`CONVERTERS` (one per version, each to the next), applied to its manifest when it is
read, so the loaders see one layout; any other format is refused, naming both versions:

* 1 (no ``format`` key), 2: pickled objects in ``.pt`` files; refused.
* 3: data-only files; an ``ss`` checkpoint may hold each rank's optimizer over its regions in
  ``optimizer_rank_R.pt`` (before the states moved into the region files), and its dataset
  hash covered ``dataset.cache_dir``: :func:`upgrade_from_3`.
* 4: every region file holds its sub-model's optimizer state; ``dataset.cache_dir`` is not
  hashed (:data:`UNHASHED`); ``dataset.root`` was: :func:`upgrade_from_4`.
* 5: ``dataset.root`` is not hashed either (the data may move); the ``data`` hash, the names and
  sizes of the training images (:func:`data_hash`), checks that the data found there is the same.

A checkpoint without a valid manifest (a rank died mid-save) is ignored; resume
takes the newest committed one. Every file is written to ``name.tmp`` then renamed,
so no half-written file carries a final name. Older checkpoints are pruned only
after a newer one is committed.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

import torch

from .fileio import atomic_write_text, file_digest

log = logging.getLogger("distnerf")

MANIFEST = "manifest.json"
MODEL_FILE = "model.pt"
SCENE_TRANSFORM_FILE = "scene_transform.json"
"""In a run directory: the similarity from the dataset's own frame into the normalised scene
frame every model, render and export of the run uses (``SceneData.transform``), when the
dataset was normalised (COLMAP, nerfstudio)."""
FORMAT_VERSION = 5  # the formats and what changed: the module docstring


def region_file(region: int) -> str:
    """The file of ``region``'s sub-model (``ss``)."""
    return f"region_{region:03d}.pt"


def optimizer_file(rank: int) -> str:
    """The optimizer state of ``rank`` in older ``ss`` checkpoints (now in each region's file)."""
    return f"optimizer_rank_{rank}.pt"


def rank_file(rank: int) -> str:
    """RNG and sampler state of ``rank`` (every strategy)."""
    return f"rank_{rank}.pt"


class CheckpointError(ValueError):
    """A checkpoint cannot be used (names the checkpoint and the reason)."""


class CheckpointFormatError(CheckpointError):
    """A committed checkpoint of another format version: refused, never skipped."""


def load_file(path: Path):
    """A checkpoint or export file's contents, read as data only (``weights_only=True``: no
    pickled code runs; tensors on the CPU).

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: the file holds more than data (e.g. written by a distnerf before
            checkpoint format 3, whose RNG states were pickled numpy objects), naming it.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint file")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch's UnpicklingError for a refused global, or a damaged file
        raise CheckpointError(f"{path}: not a data-only checkpoint file (distnerf loads checkpoints with "
                              f"weights_only=True, never running pickled code): {str(err).splitlines()[0]}") from err


def upgrade_from_3(manifest: dict) -> dict:
    """Format 3 -> 4, in memory (the files stay as written):

    * an ``ss`` checkpoint listing ``optimizer_rank_R.pt`` files kept the optimizer states per
      rank: ``optimizer_layout`` says ``per_rank`` (format 4: ``per_region``), and the loader
      reads them (at the world size and region owners they were written with);
    * its dataset hash covered ``dataset.cache_dir``, which format 4 leaves out: that hash
      cannot be carried over, so the dataset section goes to ``unchecked`` (resume then does not
      compare it, and says so).
    """
    per_rank = any(name.startswith("optimizer_rank_") for name in manifest.get("files", {}))
    return {**manifest, "format": 4, "optimizer_layout": "per_rank" if per_rank else "per_region",
            "unchecked": {**manifest.get("unchecked", {}),
                          "dataset": "format 3 hashed dataset.cache_dir with it; format 4 does not"}}


def upgrade_from_4(manifest: dict) -> dict:
    """Format 4 -> 5, in memory: its dataset hash covered ``dataset.root``, which format 5 leaves out, and
    it recorded no ``data`` hash: both sections go to ``unchecked`` (resume does not compare them, and
    says so)."""
    return {**manifest, "format": 5,
            "unchecked": {**manifest.get("unchecked", {}),
                          "dataset": "format 4 hashed dataset.root with it; format 5 does not",
                          "data": "format 4 recorded no hash of the training images"}}


CONVERTERS = {3: upgrade_from_3, 4: upgrade_from_4}
"""Format -> the converter of its manifest to the next format (applied in turn up to
:data:`FORMAT_VERSION`)."""


def upgrade(manifest: dict, found: int) -> dict:
    """``manifest`` of format ``found`` through the converters to :data:`FORMAT_VERSION`."""
    while found in CONVERTERS and found != FORMAT_VERSION:
        manifest = CONVERTERS[found](manifest)
        found = manifest["format"]
    return manifest


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step_{step:08d}"


def write_manifest(ckpt: Path, step: int, world_size: int, config_hashes: dict, extra: dict | None = None) -> None:
    """Commit a checkpoint directory: list its files with sizes and checksums."""
    files = {}
    for p in sorted(Path(ckpt).glob("*.pt")):
        files[p.name] = {"bytes": p.stat().st_size, "sha256": file_digest(p)}
    manifest = {"format": FORMAT_VERSION, "step": step, "world_size": world_size, "files": files, "config": config_hashes,
                "optimizer_layout": "per_region", "created": time.time(), **(extra or {})}
    atomic_write_text(Path(ckpt) / MANIFEST, json.dumps(manifest, indent=1))


def read_manifest(ckpt: Path, verify: bool = False) -> dict:
    """The manifest of ``ckpt``; raises CheckpointError if absent, unreadable or
    (with ``verify``) a listed file is missing or differs in size/checksum."""
    path = Path(ckpt) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError as err:
        raise CheckpointError(f"{ckpt}: no {MANIFEST} (checkpoint not committed)") from err
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path}: unreadable manifest: {err}") from err
    found = manifest.get("format", 1)
    if found in CONVERTERS:
        manifest = upgrade(manifest, found)
    if manifest.get("format", 1) != FORMAT_VERSION:
        raise CheckpointFormatError(f"{path}: checkpoint format {manifest.get('format', 1)}, this distnerf reads format "
                              f"{FORMAT_VERSION} (written by {'an older' if manifest.get('format', 1) < FORMAT_VERSION else 'a newer'} "
                              f"distnerf): use the distnerf that wrote it, or start a new run")
    for name, meta in manifest.get("files", {}).items():
        f = Path(ckpt) / name
        if not f.exists() or f.stat().st_size != meta["bytes"]:
            state = "missing" if not f.exists() else f"{f.stat().st_size} bytes, the manifest says {meta['bytes']}"
            raise CheckpointError(f"step {manifest.get('step')}: {f.name} {state} (listed in {path}): "
                                  f"missing or size differs from the manifest")
        if verify and file_digest(f) != meta["sha256"]:
            raise CheckpointError(f"step {manifest.get('step')}: {f}: checksum differs from the manifest {path}")
    return manifest


def committed(root: Path) -> list[Path]:
    """Committed checkpoint directories under ``root``, oldest first.

    Raises:
        CheckpointFormatError: a committed checkpoint of another format version.
    """
    return [d for d, err in _scan(root) if err is None]


def damaged(root: Path) -> list[str]:
    """Why each checkpoint under ``root`` that has a manifest cannot be used (a listed file
    missing or of another size), oldest first; uncommitted directories are not listed."""
    return [str(err) for d, err in _scan(root) if err is not None and (d / MANIFEST).exists()]


def _scan(root: Path) -> list[tuple[Path, CheckpointError | None]]:
    """Every ``step_*`` directory under ``root`` with why it is not usable (None: committed)."""
    out = []
    for d in sorted(Path(root).glob("step_*")):
        try:
            read_manifest(d)
        except CheckpointFormatError:
            raise  # committed, but by another distnerf: say so rather than start afresh
        except CheckpointError as err:
            out.append((d, err))
            continue
        out.append((d, None))
    return out


def latest(root: Path) -> Path | None:
    """Newest committed checkpoint under ``root`` or None."""
    found = committed(root)
    return found[-1] if found else None


def prune(root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` committed checkpoints, and uncommitted
    directories older than the newest committed one."""
    found = committed(root)
    if not found:
        return
    newest = found[-1]
    for d in sorted(Path(root).glob("step_*")):
        if d in found[-keep:] or d.name >= newest.name:
            continue
        shutil.rmtree(d, ignore_errors=True)


UNHASHED = {"model": ("compile", "compile_mode"), "dataset": ("cache_dir", "root")}
"""Keys of a section that resume ignores: the model's runtime keys (a run may resume with or
without torch.compile), where the built-in scene is generated (``dataset.cache_dir``: a
node-local directory may differ from node to node and between restarts; the scene's files are
named by everything that decides their content) and where the data lies (``dataset.root``: moved
data resumes; :func:`data_hash` checks it is the same data)."""


ADDED_AT_DEFAULT = {"model": {"density_activation": "softplus"}}
"""Keys added after checkpoints were written without them, each with the value that keeps the behaviour those
checkpoints trained with: a key at that value is left out of the hash, so such a checkpoint still resumes; set
to another value it is hashed (and refuses them). Only a key added since the last release may join: a key
already hashed by written checkpoints would, left out, make theirs differ."""


def config_hashes(cfg: dict, sections=("model", "dataset", "strategy")) -> dict:
    """sha256 of the resume-relevant config sections (JSON, sorted keys), without the
    :data:`UNHASHED` keys and the :data:`ADDED_AT_DEFAULT` keys at their old behaviour's value; the world size
    is checked separately."""
    def hashed(s: str, k: str, v) -> bool:
        added = ADDED_AT_DEFAULT.get(s, {})
        return k not in UNHASHED.get(s, ()) and not (k in added and v == added[k])

    kept = {s: {k: v for k, v in cfg[s].items() if hashed(s, k, v)} for s in sections}
    return {s: hashlib.sha256(json.dumps(kept[s], sort_keys=True, default=str).encode()).hexdigest()[:16]
            for s in sections}


def data_hash(image_paths: list, root: str, image_size: tuple[int, int]) -> str:
    """sha256 (16 hex digits) of the training images as found: each file's path relative to the dataset
    ``root`` and its size in bytes, in order, and the image size (H, W). The same data moved to another
    root hashes the same; a file added, removed, renamed or rewritten to another size does not.
    ``image_paths`` empty (a generated scene, named by its config): the image size alone.

    Raises:
        FileNotFoundError: an image file is missing (named).
    """
    listed = []
    for p in image_paths:
        try:
            listed.append([os.path.relpath(p, root) if root else os.path.basename(p), os.path.getsize(p)])
        except FileNotFoundError as err:
            raise FileNotFoundError(f"{p}: training image missing (hashing the data for resume)") from err
    body = json.dumps({"images": listed, "size": list(image_size)})
    return hashlib.sha256(body.encode()).hexdigest()[:16]


WHAT = {"data": "data (the names and file sizes of the training images found at dataset.root)"}
"""What a hashed section is, in :func:`check_compatible`'s message (else ``<section> config``)."""


def check_compatible(manifest: dict, hashes: dict, ckpt: Path) -> None:
    """Raise CheckpointError naming each config section that differs from the checkpoint (a
    section whose hash an older format's converter could not carry over is not compared; its
    converter said so in ``manifest["unchecked"]``)."""
    saved, unchecked = manifest["config"], manifest.get("unchecked", {})
    for s, why in unchecked.items():
        log.warning("resuming from %s: its %s config is not compared (%s)", ckpt, s, why)
    diff = [s for s, h in hashes.items() if s not in unchecked and saved.get(s) != h]
    if diff:
        what = ", ".join(WHAT.get(s, f"{s} config") for s in diff)
        raise CheckpointError(f"cannot resume from {ckpt}: the {what} differs from the checkpoint's "
                              f"(start a new run directory or restore the original settings)")
