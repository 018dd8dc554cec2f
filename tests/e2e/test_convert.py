"""``python -m distnerf.data.convert`` run as a module (the conversions themselves are checked in
tests/unit/test_convert.py)."""
from __future__ import annotations

import sys

from tests.conftest import run_cli


def test_cli_runs_as_a_module(tmp_path, synthetic_cache):
    proc = run_cli([sys.executable, "-m", "distnerf.data.convert", "--to", "nerfstudio", "--out", str(tmp_path / "o"),
                    "dataset=synthetic", f"dataset.cache_dir={synthetic_cache}"])
    assert "as nerfstudio" in proc.stdout and (tmp_path / "o" / "transforms.json").is_file()
