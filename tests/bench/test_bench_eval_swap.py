"""bench/throughput/eval_swap.py: the baseline's functions replace every reference in the package, and only
for the baseline's turns."""
import subprocess

import pytest

import distnerf.renderer.marching as M
import distnerf.renderer.packed as P
from bench.throughput import eval_swap as S


def test_swap_points_every_reference_at_the_baseline_and_back():
    live, shadow = S.load_baseline_module("distnerf/renderer/packed.py", "HEAD")
    assert live is P and shadow is not P and shadow.render_transmittance is not P.render_transmittance
    table = S.swap_table([(live, shadow)])
    assert "render_transmittance" in {pair[0].__name__ for pair in table.values()}
    assert "PackedSamples" not in {pair[0].__name__ for pair in table.values()}  # classes stay the checkout's
    original = P.render_transmittance
    try:
        n = S.point_at(table, True)
        # the module's own name and the one marching imported from it both point at the baseline's
        assert P.render_transmittance is shadow.render_transmittance
        assert M.render_transmittance is shadow.render_transmittance
        assert n >= 2
    finally:
        S.point_at(table, False)
    assert P.render_transmittance is original and M.render_transmittance is original


def test_an_unknown_revision_is_an_error():
    with pytest.raises(subprocess.CalledProcessError):
        S.load_baseline_module("distnerf/renderer/packed.py", "no-such-revision")


def test_baseline_modules_call_each_other_not_the_checkout():
    """A baseline marching module that imported render_transmittance from packed must call the baseline
    packed's function once linked, or the baseline's turns would run part of the checkout's code."""
    pairs = [S.load_baseline_module(p, "HEAD") for p in ("distnerf/renderer/packed.py",
                                                         "distnerf/renderer/marching.py")]
    (_, shadow_packed), (_, shadow_marching) = pairs
    assert shadow_marching.render_transmittance is P.render_transmittance  # as loaded: the checkout's
    table = S.swap_table(pairs)
    assert S.link_baselines(pairs, table) >= 1
    assert shadow_marching.render_transmittance is shadow_packed.render_transmittance
    assert shadow_marching.accumulate is shadow_packed.accumulate
