"""Every derived random stream and seed of a run, in one place.

A run has one ``seed``. Everything random is derived from it here, so that a rank, a region
or a worker draws the same numbers whichever process draws them, and no two uses share a
stream by accident:

* **Ray streams** (:func:`distnerf.sampler.base.batch_rng`: ``SeedSequence([seed, stream,
  step])``): the stream of ``ddp`` rank ``r`` is ``r``; of ``ss`` region ``k`` (independent
  training) ``k``; the reserved streams below lie far above any rank or region number.
* **Per-region seeds** (:func:`region_seed`): a region's initialisation and its jitter
  generator, from ``(seed, key)`` alone, so a region moved to another rank (elastic ``ss``)
  gets the same numbers.
"""
from __future__ import annotations

SHARED_STREAM = 1 << 30
"""The ray stream every rank draws under ``ss`` joint training (one batch, split by region)."""

JITTER_STREAM = 1 << 29
"""The stream of the jitter seed of a block batch (``ss``: one block per region)."""

LOAD_STREAM = 1 << 21
"""The ray stream of ``ss``'s start-up load estimate (never a training stream)."""


def region_seed(seed: int, key: int) -> int:
    """A seed derived from ``seed`` and a region key: ``(seed * 1000003 + 7919 * key) mod 2^62``
    (two primes, so distinct keys of one seed, and one key of nearby seeds, do not collide for
    any realistic region count). ``key`` is ``k + 1`` for region ``k``'s initialisation and ``k``
    for its jitter generator (:func:`distnerf.strategy.joint.region_generator`)."""
    return (int(seed) * 1000003 + 7919 * int(key)) % 2**62
