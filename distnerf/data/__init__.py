"""Dataset parsers and the loader registry.

``load_scene(cfg, split)`` turns a dataset config (``conf/dataset/*.yaml``; keys and
defaults per ``name``: :class:`distnerf.schema.BlenderDataset`, ``LLFFDataset``,
``SyntheticDataset``, ``ColmapDataset``, ``NerfstudioDataset``) into a ``SceneData``. For
llff, ``near``/``far``/``aabb`` override what the parser computed; the capture importers
(colmap, nerfstudio) take them in the normalised scene frame.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Optional

import torch

from distnerf.data.base import Cameras, DatasetError, MissingDatasetFile, NDCParams, SceneData
from distnerf.data.blender import as_aabb, load_blender
from distnerf.data.colmap import load_colmap
from distnerf.data.images import ImageList
from distnerf.data.llff import load_llff
from distnerf.data.nerfstudio import load_nerfstudio
from distnerf.config_check import section

__all__ = ["Cameras", "DatasetError", "ImageList", "MissingDatasetFile", "NDCParams", "SceneData", "load_blender", "load_colmap",
           "load_llff", "load_nerfstudio", "load_scene", "DATASET_NAMES"]

DATASET_NAMES = ("blender", "llff", "synthetic", "colmap", "nerfstudio")


def load_scene(cfg_dataset: Mapping, split: str = "train",
               pixels: Optional[Callable[[ImageList], torch.Tensor]] = None) -> SceneData:
    """Loads one split of the dataset described by ``cfg_dataset``.

    Args:
        cfg_dataset: mapping (dict, OmegaConf DictConfig) with ``name`` in
            ``DATASET_NAMES`` and the keys of the table above; other keys are ignored.
        split: ``"train"``, ``"val"`` or ``"test"``.
        pixels: where the decoded images go, ``pixels(image_list) -> (N, H, W, 3)``
            float32 tensor; default: decoded into RAM. ``distnerf.sampler.cache.PixelCache``
            streams them into a memory-mapped file instead.

    Returns:
        The split's SceneData.

    Raises:
        ValueError: unknown or missing ``name``, missing ``root`` (every dataset but synthetic).
        DatasetError (MissingDatasetFile for a missing file, also a FileNotFoundError): from the parsers.
    """
    cfg = section("dataset", cfg_dataset)
    name = cfg.name
    bounds = {key: cfg[key] for key in ("near", "far", "aabb")}
    if bounds["aabb"] is not None:  # plain lists (OmegaConf ListConfig -> list)
        bounds["aabb"] = [[float(x) for x in row] for row in bounds["aabb"]]
    background = tuple(float(c) for c in cfg.background)

    if name == "synthetic":
        from distnerf.data.synthetic import ensure_scene  # optional generator module

        root = ensure_scene(str(cfg.cache_dir), kind=cfg.kind, resolution=cfg.resolution,
                            appearance_jitter=cfg.appearance_jitter)
    else:
        root = cfg.root

    if name in ("blender", "synthetic"):
        return load_blender(root, split, downscale=cfg.downscale, background=background,
                            **bounds, pixels=pixels)
    if name in ("colmap", "nerfstudio"):
        capture = dict(downscale=cfg.downscale, holdout=cfg.holdout, normalize=cfg.normalize, orient=cfg.orient,
                       background=background, **bounds, pixels=pixels)
        if name == "nerfstudio":
            return load_nerfstudio(root, split, **capture)
        return load_colmap(root, split, test_list=cfg.test_list, val_list=cfg.val_list, strict=cfg.strict,
                           images=cfg.images, min_points=cfg.min_points, **capture)
    scene = load_llff(root, split, factor=cfg.factor, holdout=cfg.holdout, ndc=cfg.ndc, pixels=pixels,
                      background=background)
    changes = {key: float(bounds[key]) for key in ("near", "far") if bounds[key] is not None}
    if bounds["aabb"] is not None:
        changes["aabb"] = as_aabb(bounds["aabb"], f"dataset {root}")
    return dataclasses.replace(scene, **changes) if changes else scene

