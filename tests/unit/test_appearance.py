"""Per-image appearance (distnerf.model.appearance, ``model.appearance``) and its
evaluation protocols (distnerf.engine.evaluate, ``eval.appearance``).

References: the identity transform (renders equal the model without appearance), the
affine transform of the rendered pixel (NeRF-W / Urban Radiance Fields' per-image colour
transform) written out by hand, and a table whose rows are swapped (two rows: the mean is
bitwise the same, any lookup by a test id would change).
"""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from distnerf.data.rays import image_rays
from distnerf.engine.evaluate import evaluate_views
from distnerf.engine.held_out_appearance import appearance_protocol, check_appearance_protocol, fit_appearance
from distnerf.model import build_model
from distnerf.model.appearance import Appearance
from distnerf.config_check import ConfigError

from .test_models import AABB, WHITE, _rays
from .test_sampler import tiny_scene

SMALL = {"grid": {"name": "grid", "resolutions": [16], "upsample_steps": []},
         "grid_mlp": {"name": "grid", "resolutions": [16], "upsample_steps": [], "color": "mlp"},
         "ngp": {"name": "ngp", "log2_table_size": 10, "num_levels": 4, "max_resolution": 64},
         "nerf": {"name": "nerf", "num_coarse": 8, "num_fine": 8, "width": 32, "depth": 2}}


def _randomised(model, seed: int = 0):
    """``model`` with every parameter drawn at random (a grid renders something, not only
    background), the appearance table left as built."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith("appearance."):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        for name, p in model.named_parameters():
            if name.endswith("density") and p.dim() == 2 and p.shape[1] == 1:  # a grid's raw density: half opaque
                p.add_(4.0)
    if hasattr(model, "update_occupancy"):
        model.update_occupancy()
    return model.eval()


def _with_ids(rays, ids):
    rays.image_ids = torch.as_tensor(ids, dtype=torch.long)
    return rays


@pytest.mark.parametrize("name", list(SMALL))
def test_identity_initialisation_leaves_colours_unchanged(name):
    plain = _randomised(build_model(SMALL[name], AABB, WHITE))
    affine = build_model({**SMALL[name], "appearance": "affine"}, AABB, WHITE, num_images=3)
    missing = affine.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert missing == ["appearance.table"]  # everything else is the same model
    if hasattr(affine, "update_occupancy"):
        affine.update_occupancy()
    affine.eval()
    rays = _rays(16)
    ref = plain(rays)["rgb"]
    assert ref.std() > 0.01  # not a constant image: the check is not vacuous
    for ids in ([0, 1, 2] * 5 + [0], None):  # each image's row, and the mean row
        torch.testing.assert_close(affine(_with_ids(_rays(16), ids) if ids else rays)["rgb"], ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["grid", "ngp", "nerf"])
def test_affine_transforms_the_rendered_pixel(name):
    """Per sample plus the background (marched models) composes to ``M rgb + t`` per pixel."""
    cfg = {**SMALL[name], **({"color_threshold": 0.0, "termination": 0.0} if name != "nerf" else {})}
    plain = _randomised(build_model(cfg, AABB, WHITE))
    affine = build_model({**cfg, "appearance": "affine"}, AABB, WHITE, num_images=2)
    affine.load_state_dict(plain.state_dict(), strict=False)
    m = torch.tensor([[[0.8, 0.1, 0.0], [0.0, 1.2, 0.0], [0.05, 0.0, 0.6]], [[1.0, 0, 0], [0, 0.5, 0], [0, 0, 1.5]]])
    t = torch.tensor([[0.05, -0.1, 0.2], [0.0, 0.1, -0.05]])
    with torch.no_grad():
        affine.appearance.table.copy_(torch.cat([m, t[:, :, None]], dim=2).reshape(2, 12))
    if hasattr(affine, "update_occupancy"):
        affine.update_occupancy()
    affine.eval()
    ids = torch.arange(16) % 2
    rgb = plain(_rays(16))["rgb"]
    expected = torch.einsum("rij,rj->ri", m[ids], rgb) + t[ids]
    torch.testing.assert_close(affine(_with_ids(_rays(16), ids))["rgb"], expected, rtol=1e-5, atol=1e-5)


def test_table_shapes_codes_and_transform():
    emb = Appearance("embedding", 5, 8)
    assert emb.table.shape == (5, 8) and emb.latent_dim == 8 and not emb.table.any()
    with torch.no_grad():
        emb.table.copy_(torch.arange(40.0).view(5, 8))
    ids = torch.tensor([4, 0, 4])
    assert torch.equal(emb.codes(ids, 3), emb.table[ids])
    assert emb.codes(None, 7).shape == (7, 8) and torch.equal(emb.codes(None, 7)[3], emb.table.mean(0))
    [latent] = emb.latent(emb.codes(ids, 3), torch.tensor([2, 2, 1, 0]))  # (Q, D) by each point's ray
    assert torch.equal(latent, emb.table[[4, 4, 0, 4]])
    rgb = torch.rand(4, 3)
    assert emb.transform(rgb, None, None) is rgb  # embedding: colours untouched
    aff = Appearance("affine", 3, 99)
    assert aff.table.shape == (3, 12) and aff.latent_dim == 0 and aff.latent(aff.codes(None, 2), None) == []
    assert torch.equal(aff.table, Appearance.identity().expand(3, 12))
    code = torch.tensor([[2.0, 0, 0, 0.1, 0, 3.0, 0, 0.2, 0, 0, 4.0, 0.3]])
    torch.testing.assert_close(aff.transform(torch.ones(1, 3), code, None), torch.tensor([[2.1, 3.2, 4.3]]))
    aff.held_out = code[0]
    assert torch.equal(aff.codes(None, 2), code.expand(2, 12))  # the fitted code replaces the mean


def test_config_errors_and_colour_network_width():
    with pytest.raises(ConfigError, match="color=sh"):
        build_model({**SMALL["grid"], "appearance": "embedding"}, AABB, WHITE, num_images=2)
    with pytest.raises(ConfigError, match="appearance"):
        build_model({**SMALL["grid"], "appearance": "glo"}, AABB, WHITE)
    base = build_model(SMALL["grid_mlp"], AABB, WHITE).color_net[0].in_features
    model = build_model({**SMALL["grid_mlp"], "appearance": "embedding", "appearance_dim": 16}, AABB, WHITE,
                        num_images=4)
    assert model.color_net[0].in_features == base + 16 and model.appearance.table.shape == (4, 16)
    assert any(g["name"] == "appearance" and g["params"][0] is model.appearance.table
               for g in model.param_groups(1e-3))  # trained by the optimizer


def test_state_dict_restores_the_table_into_a_model_built_without_images():
    model = build_model({**SMALL["ngp"], "appearance": "embedding", "appearance_dim": 4}, AABB, WHITE, num_images=6)
    with torch.no_grad():
        model.appearance.table.normal_()
    loaded = build_model({**SMALL["ngp"], "appearance": "embedding", "appearance_dim": 4}, AABB, WHITE)  # render
    with pytest.raises(ValueError, match="no rows"):
        loaded.appearance.mean_code()
    loaded.load_state_dict(model.state_dict())
    assert torch.equal(loaded.appearance.table, model.appearance.table)


def _two_row_model():
    """A grid with an affine table of two distinct training images' rows."""
    model = _randomised(build_model({**SMALL["grid"], "appearance": "affine"}, AABB, WHITE, num_images=2), seed=3)
    with torch.no_grad():
        model.appearance.table.copy_(Appearance.identity().expand(2, 12))
        model.appearance.table[0, [0, 5, 10]] = torch.tensor([0.6, 0.9, 1.3])  # two different colour gains
        model.appearance.table[1, [0, 5, 10]] = torch.tensor([1.4, 0.7, 0.8])
    return model


def test_test_views_never_index_the_training_table():
    """5 test views, 2 training rows: swapping the rows leaves the mean bitwise the same but
    would change any render that looked a test id up, so every metric must be unchanged."""
    model, scene = _two_row_model(), tiny_scene(num_images=5)
    rays = image_rays(scene.cameras, 4, scene.near, scene.far)
    assert rays.image_ids is None  # evaluation rays carry no id at all
    with pytest.raises(IndexError):  # a test id would fail loudly, not wrap around
        model(_with_ids(rays, torch.full((len(rays),), 4)))
    by_row = [model(_with_ids(image_rays(scene.cameras, 0, 2.0, 6.0), torch.full((192,), k)))["rgb"] for k in (0, 1)]
    assert (by_row[0] - by_row[1]).abs().max() > 0.05  # the rows matter: the swap below is a real change
    protocols = [{"appearance": "mean"},
                 {"appearance": "fit_left_half", "appearance_steps": 3, "appearance_rays": 32}]

    def metrics():
        return [[(r["psnr"], r["ssim"]) for r in evaluate_views(model, scene, list(range(5)), 64, "cpu", None, None,
                                                                  eval_cfg=p)] for p in protocols]

    before = metrics()
    with torch.no_grad():
        model.appearance.table.copy_(model.appearance.table.flip(0).clone())
    assert metrics() == before
    assert before[0] != before[1]  # the two protocols differ (scored halves, fitted code)


def test_fit_left_half_fits_a_code_and_leaves_the_weights():
    model, scene = _two_row_model(), tiny_scene(num_images=2)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    fitted = fit_appearance(model, scene, 1, "cpu", {"appearance_steps": 5, "appearance_rays": 48})
    code = model.appearance.held_out
    assert code is not None and not code.requires_grad and fitted["fit_loss"] >= 0
    assert not torch.equal(code, model.appearance.mean_code().detach())  # moved from the mean
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())  # weights frozen
    assert all(p.grad is None for p in model.parameters())


def test_protocol_is_stated_and_refused_under_ss():
    cfg = OmegaConf.create({"model": {"appearance": "affine"}, "strategy": {"name": "ss"},
                            "eval": {"appearance": "fit_left_half", "appearance_steps": 64, "appearance_lr": 0.01,
                                     "appearance_rays": 4096}})
    with pytest.raises(ConfigError, match="fusion"):
        check_appearance_protocol(cfg)
    assert "right half" in appearance_protocol(cfg, _two_row_model())
    cfg.eval.appearance = "mean"
    check_appearance_protocol(cfg)
    assert appearance_protocol(cfg, _two_row_model()).startswith("mean")
    assert appearance_protocol(cfg, build_model(SMALL["grid"], AABB, WHITE)).startswith("none")
