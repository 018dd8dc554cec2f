"""Input larger than memory (issue 30): the pixel cache decodes a replicated Blender set image by image
into a file, with progress lines, and reading every pixel through the map adds no anonymous memory."""
import logging
import os

import pytest
import torch

from tests.conftest import LEGO
from distnerf.data import load_scene
from distnerf.data.images import undecoded
from distnerf.sampler.cache import PixelCache, cached_file


def _tool():
    from bench.memory import large_input

    return large_input


@pytest.mark.skipif(not LEGO.is_dir(), reason="needs ../shared/data (nerf_synthetic_half/lego)")
def test_replicated_set_decodes_into_a_mapped_cache_without_anonymous_memory(tmp_path, caplog):
    tool = _tool()
    frames = tool.replicate_blender(LEGO, tmp_path / "large", copies=3)
    assert frames == 300
    cfg = {"name": "blender", "root": str(tmp_path / "large")}
    listed = load_scene(cfg, "train", pixels=undecoded)
    assert len(listed) == 300
    before = tool.rss_anon_mib(os.getpid())
    with caplog.at_level(logging.INFO, logger="distnerf"):
        scene = load_scene(cfg, "train", pixels=PixelCache(tmp_path / "cache", num_threads=2, progress_every_s=0.0))
    decoded_mib = scene.images.numel() * 4 / 2 ** 20  # 300 x 400 x 400 x 3 float32: 549 MiB
    assert decoded_mib > 500 and cached_file(scene.images) is not None
    total = float(scene.images.sum(dtype=torch.float64))  # every page read through the map
    grown = tool.rss_anon_mib(os.getpid()) - before
    # decoded into RAM the split would add ~decoded_mib of anonymous memory; mapped, the pages are the
    # page cache's (RssFile). A bound of a tenth leaves room for the allocator and the reading's chunks
    assert grown < 0.1 * decoded_mib, (grown, decoded_mib)
    assert total > 0
    lines = [r.getMessage() for r in caplog.records if "pixel cache: decoded" in r.getMessage()]
    assert len(lines) >= 2 and lines[-1].startswith("pixel cache: decoded 300/300"), lines
    assert "img/s" in lines[-1]
