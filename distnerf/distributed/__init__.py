"""Distributed environment, split by concern; every name is re-exported here, so callers write
``from distnerf import distributed as D; D.init_distributed(...)``.

- :mod:`.env`: the process group: :class:`DistEnv` (rank, world size, device, backend),
  :func:`init_distributed` (joining under torchrun), :func:`end_setup`, :func:`shutdown`, the
  CUDA device of a local rank (:func:`cuda_index`).
- :mod:`.collectives`: every collective of the package (a test scans ``distnerf/`` for
  ``torch.distributed`` collectives outside this package) and the classification of their errors.
- :mod:`.agent`: a rank whose torchrun agent died stops, naming it (:class:`AgentWatch`).
- :mod:`.signals`: the stop requested by the preemption signal or SIGTERM (:class:`StopRequest`).
- :mod:`.rng`: seeding, and the random states a checkpoint saves and restores.
- :mod:`.compat`: version shims (torch APIs chosen by their signatures).

Inside the package the modules import in one direction: ``compat`` <- ``env`` <- ``collectives``;
``agent``, ``signals`` and ``rng`` import none of them.
"""
import torch.distributed as dist  # noqa: F401  (``D.dist``: the torch module these helpers call)

from .collectives import (COLLECTIVE_FAILURES, OPS, PEER_LOST, all_gather, all_gather_floats, all_gather_into, all_reduce_,
                          all_reduce_max, all_reduce_or, all_reduce_or_bytes, all_reduce_sum, all_to_all_rows, barrier,
                          broadcast_object, collective_failure, event_seconds, device_timed, exchange_counts, gather_objects,
                          peer_lost, rank, timing_event, world_size)
from .agent import EXIT_AGENT_LOST, AgentWatch, torchrun_agent_pid
from .compat import accepts, ddp_buffer_kwargs
from .env import DistEnv, SetupTimeout, cuda_index, end_setup, init_distributed, new_host_group, shared_cuda_index, \
    shared_devices, shutdown
from .rng import own_cuda_state, rng_state, seed_everything, set_rng_state
from .signals import PREEMPT_SIGNALS, StopRequest, preempt_signal

__all__ = ["COLLECTIVE_FAILURES", "EXIT_AGENT_LOST", "OPS", "PEER_LOST", "PREEMPT_SIGNALS", "AgentWatch", "DistEnv",
           "SetupTimeout", "StopRequest", "torchrun_agent_pid",
           "accepts", "all_gather", "all_gather_floats", "all_gather_into", "all_reduce_", "all_reduce_max", "all_reduce_or",
           "all_reduce_or_bytes", "all_reduce_sum", "all_to_all_rows", "barrier",
           "broadcast_object", "collective_failure", "cuda_index", "ddp_buffer_kwargs", "device_timed", "end_setup",
           "event_seconds", "exchange_counts", "gather_objects", "init_distributed", "new_host_group", "own_cuda_state", "peer_lost",
           "preempt_signal", "rank", "rng_state", "seed_everything", "set_rng_state", "shared_cuda_index", "shared_devices",
           "shutdown", "timing_event", "world_size"]
