"""The device sampler: all pixels on the accelerator, rays generated there.

Legend: R rays per batch, N images, H, W image size.

Only the R random pixel indices are drawn on the host (the same numpy stream as
every other sampler, microseconds); they are copied to the device, where rays
are generated and colours gathered. Bitwise equal to ``sync``: pixel choice,
colours, ``near``/``far``, jitter seeds and (without a ray filter) valid masks on
any device; on the CPU everything. On CUDA the ray geometry goes through the same
:func:`generate_rays` ops, but one of them is not reproducible across devices: ``torch.norm`` on the
CPU uses its own reduction (no elementwise formula matches it bitwise, checked on
400k rays), so ``viewdirs`` (and world-space ``directions``) can differ by 1 ulp;
the camera rotation (einsum) equals an explicit multiply-add on the CPU and should
match on CUDA. Making ``device`` bitwise on CUDA means computing the norm as an
explicit ``sqrt(x*x + y*y + z*z)`` in ``generate_rays``, which changes ``sync``'s
historical batches by 1 ulp once; not done (``sync`` is kept bitwise).
"""
from __future__ import annotations

import logging
from dataclasses import replace

import torch

from ..data.base import SceneData
from ..schema import SamplerConfig
from .base import BatchSpec, RayBatch, Sampler, make_batch
from .files import image_files

log = logging.getLogger("distnerf")


def scene_bytes(scene: SceneData) -> int:
    """Bytes the device sampler puts on the device (pixels + cameras)."""
    return scene.images.numel() * scene.images.element_size() + len(scene) * 16 * 4


def fits_on_device(scene: SceneData, device: torch.device,
                   max_fraction: float = SamplerConfig.max_device_fraction) -> tuple[bool, str]:
    """Whether the scene's pixels fit in ``max_fraction`` of the device's free memory.

    Returns:
        ``(fits, reason)``; ``reason`` states the sizes when it does not fit.
    """
    need = scene_bytes(scene)
    if device.type != "cuda":
        return True, ""
    free, _ = torch.cuda.mem_get_info(device)
    if need > max_fraction * free:
        return False, (f"the training images need {need / 2**30:.2f} GiB on {device}, more than "
                       f"sampler.max_device_fraction={max_fraction} of the {free / 2**30:.2f} GiB free")
    return True, ""


class DeviceSampler(Sampler):
    """Keeps the training pixels and cameras on ``device`` and builds batches there.

    Args:
        scene: the training split (CPU tensors; copied to ``device`` once).
        spec: what to draw.
        device: the training device.
    """

    name = "device"

    def __init__(self, scene: SceneData, spec: BatchSpec, device: torch.device | str):
        if len(scene) == 0:
            raise ValueError(f"training split of {scene.source} has no images")
        if image_files(scene.images) is not None:
            raise ValueError("sampler=device keeps all pixels on the device, but the scene was loaded with "
                             "sampler.source=files (decoded per batch on the CPU): use sampler=pipelined or "
                             "sampler.source=memory")
        super().__init__(spec, device)
        c = scene.cameras
        move = lambda t: t.to(self.device)  # noqa: E731
        cams = c.map(move)
        self.scene = replace(scene, images=scene.images[:0], cameras=cams)  # the sampling mask stays on the CPU
        self._flat_rgb = scene.images.reshape(-1, 3).to(self.device)

    def host_batch(self, step: int) -> RayBatch:
        """The batch of ``step``, already on the device."""
        self.next_step = step + 1
        return make_batch(self.spec, self.scene, self._flat_rgb, step, self.device)

    def to_device(self, batch: RayBatch) -> RayBatch:
        return batch

    def close(self) -> None:
        self._flat_rgb = None

