"""The video path of ``python -m distnerf.render video=PATH`` (the videos themselves: tests/e2e/test_render_video.py)."""
from __future__ import annotations

import pytest

from distnerf.render import video_path
from distnerf.config_check import ConfigError


def test_video_takes_a_path_with_a_known_suffix():
    assert video_path("out/fly.mp4").name == "fly.mp4"
    with pytest.raises(ConfigError, match="orbit=true"):
        video_path("True")
    with pytest.raises(ConfigError, match="suffix"):
        video_path("fly.png")
