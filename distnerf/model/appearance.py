"""Per-image appearance: one learned code per *training* image (``model.appearance``).

Legend: N training images, R rays, Q points that get a colour, D code width.

Two kinds, both a table of N rows indexed by the training image of each ray
(:attr:`~distnerf.data.rays.RayBundle.image_ids`, filled by every sampler):

* ``embedding``: Generative Latent Optimization (GLO, Bojanowski et al. 2018) as NeRF in the
  Wild uses it (Martin-Brualla et al., CVPR 2021, Sec. 4.1: the appearance embedding
  ``l^(a)_i``): a (N, D) table, D = ``model.appearance_dim``, whose row is concatenated to
  the colour network's input, so that the colour may depend on the image (exposure, white
  balance, lighting) while the density may not. Initialised to zeros (every image alike).
  Needs a colour *network*: ``grid`` with ``color=sh`` refuses it.
* ``affine``: a per-image colour transform ``c' = M c + t`` (M 3x3, t 3; a (N, 12) table
  holding ``[M | t]`` row-major), initialised to the identity ``[I | 0]``. It is applied to
  each sample's colour and, when the render has one, to the background, which composes to
  the transform of the rendered pixel, since the compositing weights and the transmittance
  left behind the last sample sum to one::

      sum_i w_i (M c_i + t) + T (M b + t) = M (sum_i w_i c_i + T b) + t

  So it works with any colour model (spherical harmonics included). Where segments are
  composited outside the model (``ss`` joint training, the ``ss`` fusion stage) the samples
  are transformed and the background is not. A transformed colour may leave [0, 1].

Rays without image ids (evaluation, point queries, the ``ss`` fusion stage) get one code
for all rays: :attr:`Appearance.held_out` when set (the ``fit_left_half`` protocol of
:mod:`distnerf.engine.evaluate`), else the mean of the table's rows (for ``affine`` the
mean transform). A test view's id never indexes the table: ids are training indices only.

Distributed: the table is an ordinary dense parameter. Under ``ddp`` its gradient (zero but
for the rows of the images in the step's batch) is all-reduced in DDP's buckets with the rest
of the model; a large, mostly zero bucket travels as (index, value) pairs like the grid
tables' (:mod:`distnerf.strategy.ddp`, ``sparse_min_numel``). Under ``ss`` every region's
sub-model holds its own table over all N training images; rows of images whose rays never
cross a region keep their initial value.
"""
from __future__ import annotations

import torch
from torch import nn

from ..config_check import ConfigError

#: the table's learning rate relative to the run's base lr: a code is trained only by the rays of
#: its own image (a 1/N share of the batch), so it moves slower than the shared weights
LR_SCALE = 10.0


class Appearance(nn.Module):
    """A table of per-training-image appearance codes.

    Args:
        kind: ``embedding`` or ``affine`` (see the module docstring).
        num_images: N training images (rows). A model built for loading a checkpoint may
            pass 0: the table takes the saved shape when the state is loaded.
        dim: D of ``embedding`` (``affine`` always has 12).
    """

    def __init__(self, kind: str, num_images: int, dim: int):
        super().__init__()
        assert kind in ("embedding", "affine"), kind
        self.kind = kind
        width = int(dim) if kind == "embedding" else 12
        table = torch.zeros(int(num_images), width)
        if kind == "affine":
            table[:] = self.identity()
        self.table = nn.Parameter(table)
        #: (D,) code used for rays without image ids instead of the mean row (not saved)
        self.held_out: torch.Tensor | None = None

    @staticmethod
    def identity() -> torch.Tensor:
        """(12,) float32 ``[I | 0]``: the affine code that leaves colours unchanged."""
        return torch.cat([torch.eye(3), torch.zeros(3, 1)], dim=1).reshape(12)

    @property
    def latent_dim(self) -> int:
        """Width this adds to the colour network's input (D for ``embedding``, else 0)."""
        return self.table.shape[1] if self.kind == "embedding" else 0

    def param_group(self, lr: float, name: str = "appearance") -> dict:
        """The optimizer group of the table: the run's base ``lr`` x :data:`LR_SCALE`."""
        return {"params": [self.table], "lr": lr * LR_SCALE, "name": name}

    def mean_code(self) -> torch.Tensor:
        """(D,) mean of the rows: the code of the ``mean`` evaluation protocol."""
        if self.table.shape[0] == 0:
            raise ValueError("appearance table has no rows: the model was built with num_images=0 and no "
                             "state was loaded (pass the number of training images to build_model)")
        return self.table.mean(dim=0)

    def codes(self, image_ids: torch.Tensor | None, num_rays: int) -> torch.Tensor:
        """Per-ray codes.

        Args:
            image_ids: (R,) int64 training image index of each ray, or None.
            num_rays: R.
        Returns:
            (R, D) float: the rows of ``image_ids``, else :attr:`held_out` or the mean row for
            every ray (an expanded view).
        """
        if image_ids is not None:
            return self.table[image_ids]
        code = self.held_out if self.held_out is not None else self.mean_code()
        return code.expand(num_rays, -1)

    def latent(self, codes: torch.Tensor, ray_indices: torch.Tensor | None) -> list[torch.Tensor]:
        """The colour network's extra inputs: ``[codes[ray_indices]]`` ((Q, D)) for
        ``embedding``, ``[]`` for ``affine``. ``ray_indices``: (Q,) int64, or None (one code per point)."""
        if self.kind != "embedding":
            return []
        return [codes if ray_indices is None else codes[ray_indices]]

    def transform(self, rgb: torch.Tensor, codes: torch.Tensor, ray_indices: torch.Tensor | None) -> torch.Tensor:
        """``affine``: ``M rgb + t`` with each point's ray's code; ``embedding``: ``rgb`` unchanged.

        Args:
            rgb: (Q, 3) float colours. codes: (R, 12) per ray (or (Q, 12) with ``ray_indices`` None).
            ray_indices: (Q,) int64 ray of each colour, or None.
        Returns:
            (Q, 3) float.
        """
        if self.kind != "affine":
            return rgb
        c = (codes if ray_indices is None else codes[ray_indices]).to(rgb.dtype).view(-1, 3, 4)
        return torch.baddbmm(c[:, :, 3:], c[:, :, :3], rgb[:, :, None])[:, :, 0]

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # a model built without the run's image count (render, export, fusion) takes the saved table's rows
        saved = state_dict.get(prefix + "table")
        if saved is not None and saved.shape != self.table.shape:
            self.table = nn.Parameter(self.table.new_zeros(saved.shape))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def build_appearance(kind: str, num_images: int, dim: int, has_colour_net: bool = True) -> Appearance | None:
    """The :class:`Appearance` of ``model.appearance`` (None for ``none``).

    Raises:
        ConfigError: ``embedding`` for a model without a colour network (``grid`` with ``color=sh``).
    """
    if kind == "none":
        return None
    if kind == "embedding" and not has_colour_net:
        raise ConfigError("config model.appearance=embedding feeds a per-image code to a colour network, but "
                          "model.color=sh has none: use model.color=mlp, or model.appearance=affine (works with SH)")
    return Appearance(kind, num_images, dim)
