"""``model.max_params``: a model sized by its parameter budget at its final stage.

Every parameter outside the sized tables (MLPs, a sub-model's context tables, appearance
codes) is counted by building a *probe*, the same model with the smallest tables, so the
budget covers whatever the model holds; the tables then get the rest:

* ``grid``: the last of ``resolutions`` is the largest N with ``fixed + V rows(N) <= max_params``
  (V = values per vertex: density + features; rows(N) = N^3, or with ``cubic_voxels`` the
  product of :func:`~distnerf.model.grid_tables.voxel_shape`); the earlier resolutions keep their ratio to
  the last (rounded, at least 2). A cube moves in steps of about 3/N of its size, so the
  count is within 1% of the budget once N >= 300; below, within that step.
* ``ngp``: the hash table size T (rows per level, any integer: the hash is ``mod T``) is the
  largest with ``fixed + F sum_l min(T, (N_l + 1)^3) <= max_params``: within
  ``F x levels`` parameters of the budget, unless every level is dense first.
"""
from __future__ import annotations

from omegaconf import DictConfig

from ..config_check import ConfigError, derive

PROBE = {"grid": {"resolutions": [2], "upsample_steps": []}, "ngp": {"log2_table_size": 4}}


def num_parameters(module) -> int:
    return sum(p.numel() for p in module.parameters())


def scaled_resolutions(resolutions: list[int], final: int) -> list[int]:
    """``resolutions`` with the last replaced by ``final``, the others keeping their ratio to it.

    >>> scaled_resolutions([64, 128, 160], 320)
    [128, 256, 320]
    """
    out = [min(max(2, round(r * final / resolutions[-1])), final) for r in resolutions[:-1]] + [final]
    for i in range(len(out) - 2, -1, -1):  # coarse to fine stays non-decreasing
        out[i] = min(out[i], out[i + 1])
    return out


def _largest(fits, low: int, high: int) -> int:
    """The largest integer n in [low, high] with ``fits(n)`` (monotone), assuming ``fits(low)``."""
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def fit_budget(cls, cfg: DictConfig, aabb, background, extra: dict) -> tuple[DictConfig, dict, dict]:
    """The config (and constructor keywords) of ``cls`` holding at most ``cfg.max_params`` parameters.

    Args:
        cls: the model class (``GridModel`` or ``NGPModel``). cfg: its validated config.
        aabb, background, extra: the constructor's other arguments (a focus box, ...).
    Returns:
        (config, constructor keywords, report): the report holds ``max_params``,
        ``final_parameters`` (the final stage's count) and the derived sizes.
    Raises:
        ConfigError: another model, or a budget too small for the parameters outside the tables.
    """
    budget, name = int(cfg.max_params), cfg.name
    if name not in PROBE:
        raise ConfigError(f"config model.max_params={budget}: sizing by a parameter budget is implemented for "
                          f"model=grid and model=ngp, not model={name}; set model.max_params=null")
    probe = cls(aabb, background, derive(cfg, **PROBE[name]), **extra)
    total = num_parameters(probe)
    if name == "grid":
        per_vertex = probe.density.shape[1] + probe.features.shape[1]
        fixed = total - probe.density.numel() - probe.features.numel()
        size = lambda n: fixed + per_vertex * probe.num_vertices(n)  # noqa: E731
        if size(2) > budget:
            raise ConfigError(f"config model.max_params={budget} is too small: the colour network, context "
                              f"tables and other non-grid parameters alone hold {fixed}, and the smallest grid "
                              f"(2^3 vertices) needs {size(2) - fixed} more")
        final = _largest(lambda n: size(n) <= budget, 2, max(2, round(((budget - fixed) / per_vertex) ** (1 / 3))) + 4)
        resolutions = scaled_resolutions(list(cfg.resolutions), final)
        return (derive(cfg, resolutions=resolutions), {},
                {"max_params": budget, "final_parameters": size(final), "resolutions": resolutions})
    enc = probe.encoding
    dense = [(int(r) + 1) ** 3 for r in enc.resolutions]
    fixed = total - enc.table.numel()
    size = lambda t: fixed + enc.features_per_level * sum(min(t, d) for d in dense)  # noqa: E731
    if size(1) > budget:
        raise ConfigError(f"config model.max_params={budget} is too small: the MLPs and other non-table "
                          f"parameters alone hold {fixed}, and a hash table of one row per level needs "
                          f"{size(1) - fixed} more")
    if size(max(dense)) < 0.99 * budget:
        raise ConfigError(f"config model.max_params={budget} exceeds what the hash grid can hold ({size(max(dense))} "
                          f"parameters with every level dense): raise model.max_resolution or lower max_params")
    table = _largest(lambda t: size(t) <= budget, 1, max(dense))
    return cfg, {"table_size": table}, {"max_params": budget, "final_parameters": size(table), "table_size": table}
