"""Ray batch sampling. The sampler knows scenes and rays, never models."""
from .sync import RayBatch, SyncSampler, batch_rng

__all__ = ["RayBatch", "SyncSampler", "batch_rng"]
