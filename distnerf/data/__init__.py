"""Dataset parsers and the loader registry.

``load_scene(cfg, split)`` turns a dataset config into a ``SceneData``:

========== ===================================================================
name       keys (``name`` required; all others optional unless noted)
========== ===================================================================
blender    root (required), downscale, background, near, far, aabb
llff       root (required), factor, holdout, ndc, background, near, far, aabb
synthetic  cache_dir, kind, resolution, downscale, background, near, far, aabb
========== ===================================================================

``split`` may be given in the config instead of the argument (argument wins; default
``train``). For llff, ``near``/``far``/``aabb`` override what the parser computed.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Optional

import torch

from distnerf.data.base import Cameras, DatasetError, NDCParams, SceneData
from distnerf.data.blender import as_aabb, load_blender
from distnerf.data.images import ImageList
from distnerf.data.llff import load_llff

__all__ = ["Cameras", "DatasetError", "ImageList", "NDCParams", "SceneData", "load_blender", "load_llff",
           "load_scene", "DATASET_NAMES"]

DATASET_NAMES = ("blender", "llff", "synthetic")
DEFAULT_SYNTHETIC_CACHE = ".cache/synthetic"


def load_scene(cfg_dataset: Mapping, split: Optional[str] = None,
               pixels: Optional[Callable[[ImageList], torch.Tensor]] = None) -> SceneData:
    """Loads one split of the dataset described by ``cfg_dataset``.

    Args:
        cfg_dataset: mapping (dict, OmegaConf DictConfig) with ``name`` in
            ``DATASET_NAMES`` and the keys of the table above; other keys are ignored.
        split: ``"train"``, ``"val"`` or ``"test"``; default ``cfg_dataset["split"]``,
            else ``"train"``.
        pixels: where the decoded images go, ``pixels(image_list) -> (N, H, W, 3)``
            float32 tensor; default: decoded into RAM. ``distnerf.sampler.cache.PixelCache``
            streams them into a memory-mapped file instead.

    Returns:
        The split's SceneData.

    Raises:
        ValueError: unknown or missing ``name``, missing ``root`` for blender/llff.
        FileNotFoundError, DatasetError: from the parsers.
    """
    cfg = dict(cfg_dataset)
    name = cfg.get("name")
    if name not in DATASET_NAMES:
        raise ValueError(f"unknown dataset name {name!r}; expected one of {DATASET_NAMES}")
    split = split if split is not None else _get(cfg, "split", "train")
    bounds = {key: cfg.get(key) for key in ("near", "far", "aabb")}
    if bounds["aabb"] is not None:  # plain lists (OmegaConf ListConfig -> list)
        bounds["aabb"] = [[float(x) for x in row] for row in bounds["aabb"]]
    background = cfg.get("background")
    background = None if background is None else tuple(float(c) for c in background)

    if name == "synthetic":
        from distnerf.data.synthetic import ensure_scene  # optional generator module

        kwargs = {key: cfg[key] for key in ("kind", "resolution") if cfg.get(key) is not None}
        root = ensure_scene(str(cfg.get("cache_dir") or DEFAULT_SYNTHETIC_CACHE), **kwargs)
        name = "blender"
    else:
        root = cfg.get("root")
        if not root:
            raise ValueError(f"dataset {name!r} needs 'root' (the scene folder) in its config")

    if name == "blender":
        extra = {} if background is None else {"background": background}
        return load_blender(root, split, downscale=int(_get(cfg, "downscale", 1)), **extra,
                            **bounds, pixels=pixels)
    scene = load_llff(root, split, factor=int(_get(cfg, "factor", 8)),
                      holdout=int(_get(cfg, "holdout", 8)), ndc=bool(_get(cfg, "ndc", True)), pixels=pixels,
                      **({} if background is None else {"background": background}))
    changes = {key: float(bounds[key]) for key in ("near", "far") if bounds[key] is not None}
    if bounds["aabb"] is not None:
        changes["aabb"] = as_aabb(bounds["aabb"], f"dataset {root}")
    return dataclasses.replace(scene, **changes) if changes else scene


def _get(cfg: dict, key: str, default):
    """``cfg[key]``, or ``default`` when absent or None (null in YAML)."""
    value = cfg.get(key)
    return default if value is None else value
