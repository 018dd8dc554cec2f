"""The original NeRF (Mildenhall et al., ECCV 2020): the reference architecture.

Legend: R rays, S samples per ray, P = R * S points.

Positional encoding with 10 frequencies for positions and 4 for directions; an
8 x 256 ReLU MLP with the input re-injected at layer 5 (skip connection); density
from the trunk, colour from a 128-wide view-dependent head. Hierarchical sampling:
64 stratified coarse samples, then 128 importance samples from the coarse weights,
the fine network evaluated on the sorted union (Sec. 5.2). The loss covers both
passes (``rgb_coarse`` is returned for it).

Memory: without a gradient (evaluation) the MLPs see at most :attr:`NeRFModel.point_chunk`
points per call. An (R, S) batch is R * S points, each holding ~3.6 kB (measured) of fp32
activations in the 8 x 256 MLP at once, so ``eval.chunk=65536`` rays x 192 fine samples =
12.6 M points would need ~43 GiB in one call; 262144 points per call need ~1 GB. The
result is the same to float rounding (every point is computed on its own; a matrix
product of a few rows may take another kernel).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..data.rays import RayBundle
from ..renderer.output import RenderOutput
from ..renderer.samples import intervals_from_points, sample_pdf, stratified_samples
from ..renderer.volume import volume_render
from ..config_check import section
from ..schema import NeRFModelConfig
from .appearance import build_appearance
from .base import RadianceModel
from .encoding import PositionalEncoding


class NeRFMLP(nn.Module):
    """The NeRF MLP: (P, 3) points and (P, 3) unit view directions (and (P, latent_dim) appearance
    codes, NeRF-W's colour-head input) -> sigma (P,), rgb (P, 3).

    ``pos_frequencies``, ``dir_frequencies``, ``width``, ``depth``: the ``model`` keys of the same
    names (:class:`~distnerf.schema.NeRFModelConfig`); ``skip``: the trunk layer after which the
    encoded points are fed again (NeRF's: 4); ``latent_dim``: appearance code width (0: none)."""

    def __init__(self, *, pos_frequencies: int, dir_frequencies: int, width: int, depth: int, skip: int = 4,
                 latent_dim: int = 0):
        super().__init__()
        self.pos_enc, self.dir_enc = PositionalEncoding(pos_frequencies), PositionalEncoding(dir_frequencies)
        in_pos, in_dir = self.pos_enc.output_dim(3), self.dir_enc.output_dim(3)
        self.skip = skip
        layers = []
        for i in range(depth):
            fan_in = in_pos if i == 0 else width + (in_pos if i == skip + 1 else 0)
            layers.append(nn.Linear(fan_in, width))
        self.trunk = nn.ModuleList(layers)
        self.sigma_head = nn.Linear(width, 1)
        self.feature = nn.Linear(width, width)
        self.color_head = nn.Sequential(nn.Linear(width + in_dir + latent_dim, width // 2), nn.ReLU(),
                                        nn.Linear(width // 2, 3))

    def forward(self, points: torch.Tensor, viewdirs: torch.Tensor, latent: torch.Tensor | None = None):
        x_in = self.pos_enc(points)
        h = x_in
        for i, layer in enumerate(self.trunk):
            if i == self.skip + 1:
                h = torch.cat([x_in, h], dim=-1)
            h = F.relu(layer(h))
        sigma = F.relu(self.sigma_head(h)[:, 0])
        extra = [] if latent is None else [latent]
        rgb = torch.sigmoid(self.color_head(torch.cat([self.feature(h), self.dir_enc(viewdirs), *extra], -1)))
        return sigma, rgb


class NeRFModel(RadianceModel):
    """Coarse + fine NeRF.

    Args:
        aabb, background: see :class:`RadianceModel` (aabb unused by sampling).
        cfg, options: the keys of :class:`~distnerf.schema.NeRFModelConfig` (defaults there):
        num_coarse, num_fine: samples per ray of the two passes.
        width, depth: MLP size.
        appearance, appearance_dim: per-image appearance (:mod:`.appearance`): ``embedding`` feeds
            the colour head, ``affine`` transforms the rendered pixel. num_images: rows of its table.
    """

    #: points per MLP call when no gradient is recorded (0: all at once). Evaluation sets it from
    #: ``eval.point_chunk`` for the duration of a render (:func:`distnerf.engine.evaluate.render_image`);
    #: training (gradients recorded) always evaluates the whole batch in one call.
    point_chunk: int = 0

    def __init__(self, aabb, background, cfg=None, *, num_images: int = 0, **options):
        c = section(NeRFModelConfig, cfg, **options)  # the keys above; defaults: distnerf/schema.py
        num_coarse, num_fine, width, depth = c.num_coarse, c.num_fine, c.width, c.depth
        pos_frequencies, dir_frequencies = c.pos_frequencies, c.dir_frequencies
        super().__init__(aabb, background)
        self.num_coarse, self.num_fine = num_coarse, num_fine
        self.appearance = build_appearance(c.appearance, num_images, c.appearance_dim)
        latent_dim = self.appearance.latent_dim if self.appearance is not None else 0
        mlp = dict(pos_frequencies=pos_frequencies, dir_frequencies=dir_frequencies, width=width, depth=depth,
                   latent_dim=latent_dim)
        self.coarse = NeRFMLP(**mlp)
        self.fine = NeRFMLP(**mlp) if num_fine > 0 else None

    def field(self, points: torch.Tensor, viewdirs: torch.Tensor, level: str = "fine"):
        """Point query of the ``fine`` (default; the coarse one without a fine network)
        or ``coarse`` network: (P, 3) points, (P, 3) unit viewdirs -> sigma (P,), rgb (P, 3)."""
        mlp = self.fine if level == "fine" and self.fine is not None else self.coarse
        app = self.appearance
        codes = app.codes(None, points.shape[0]) if app is not None else None  # the held-out / mean code
        sigma, rgb = self._query(mlp, points, viewdirs, codes if app is not None and app.latent_dim else None)
        return sigma, (rgb if app is None else app.transform(rgb, codes, None))

    def _query(self, mlp: NeRFMLP, points: torch.Tensor, viewdirs: torch.Tensor, latent: torch.Tensor | None = None):
        """``mlp(points, viewdirs, latent)``, in calls of at most :attr:`point_chunk` points when no
        gradient is recorded: (P, 3), (P, 3), (P, D) or None -> sigma (P,), rgb (P, 3)."""
        n, num_points = self.point_chunk, points.shape[0]
        if n <= 0 or num_points <= n or torch.is_grad_enabled():
            return mlp(points, viewdirs, latent)
        sigma = rgb = None
        for start in range(0, num_points, n):
            s, c = mlp(points[start:start + n], viewdirs[start:start + n],
                       None if latent is None else latent[start:start + n])
            if sigma is None:  # dtype of the first part (bf16 under autocast)
                sigma, rgb = s.new_empty(num_points), c.new_empty(num_points, 3)
            sigma[start:start + n], rgb[start:start + n] = s, c
        return sigma, rgb

    def _render(self, mlp, rays: RayBundle, t_starts, t_ends):
        r, s = t_starts.shape
        t_mid = 0.5 * (t_starts + t_ends)
        points = rays.origins[:, None] + rays.directions[:, None] * t_mid[..., None]
        dirs = rays.viewdirs[:, None].expand(r, s, 3)
        app = self.appearance
        codes = app.codes(rays.image_ids, r) if app is not None else None  # (R, D)
        latent = codes[:, None].expand(r, s, -1).reshape(r * s, -1) if app is not None and app.latent_dim else None
        sigma, rgb = self._query(mlp, points.reshape(-1, 3), dirs.reshape(-1, 3), latent)
        out = volume_render(sigma.view(r, s), rgb.view(r, s, 3), t_starts, t_ends, self.background)
        if app is not None:  # affine: the rendered pixel, background included; embedding: unchanged
            out.rgb = app.transform(out.rgb, codes, None)
        return out

    @property
    def renders_coarse(self) -> bool:
        return self.fine is not None

    def forward(self, rays: RayBundle, generator=None) -> RenderOutput:
        t_starts, t_ends = stratified_samples(rays.near, rays.far, self.num_coarse, self.training, generator)
        coarse = self._render(self.coarse, rays, t_starts, t_ends)
        coarse.num_samples = t_starts.numel()
        if self.fine is None:
            return coarse
        bins = torch.cat([t_starts, t_ends[:, -1:]], dim=-1)
        t_fine = sample_pdf(bins, coarse.weights.detach(), self.num_fine, self.training, generator)
        t_all = torch.sort(torch.cat([t_starts, t_fine], dim=-1), dim=-1).values
        f_starts, f_ends = intervals_from_points(t_all, rays.far)
        fine = self._render(self.fine, rays, f_starts, f_ends)
        fine.rgb_coarse, fine.opacity_coarse = coarse.rgb, coarse.opacity
        fine.num_samples = coarse.num_samples + f_starts.numel()
        return fine
