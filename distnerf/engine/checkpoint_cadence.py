"""When checkpoints are written, what goes into one, and how a run resumes from it.

The file names and the manifest are :mod:`distnerf.checkpoint`'s; the strategy writes
and reads the model files (``model.pt`` under ``ddp``, one file per region under
``ss``); this module owns the cadence (``checkpoints.every``, ``checkpoints.every_minutes``,
``checkpoints.at_minutes``, ``checkpoints.keep``, the final save), the per-rank RNG and
sampler state, and the background write (``checkpoints.background``).

Off the critical path. A periodic checkpoint costs the loop one copy of the state to the host
(parameters, optimizer moments, RNG and sampler state: :func:`host_copy`); a background thread
writes the files and commits them while training goes on. The commit protocol is the
synchronous one, run by that thread on a gloo group of its own (so its collectives never
interleave with the loop's): every file through ``name.tmp`` and a rename, every rank's outcome
gathered, then the main rank's manifest (the commit), then pruning. So a process killed during
the write leaves the last committed checkpoint as it was and the new directory without a
manifest, which resume ignores (:func:`distnerf.checkpoint.latest`). One write is in flight at
a time: the next save, the final one and :meth:`Checkpointer.close` first wait for it, and a
write that failed raises there, at a step every rank reaches (:class:`CheckpointWriteError`,
naming the last committed checkpoint); its failure is logged when it happens.
"""
from __future__ import annotations

import copy
import logging
import math
import shutil
import threading
from pathlib import Path

import torch

from .. import checkpoint as ckpt
from ..config_check import typed
from ..fileio import CheckpointWriteError, atomic_torch_save
from .. import distributed as D
from ..schema import CheckpointsConfig

log = logging.getLogger("distnerf")


def host_copy(obj):
    """``obj`` (nested dicts, lists and tuples) with every tensor copied to host memory, detached, and
    every other leaf deep-copied: a snapshot that training can no longer change."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: host_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(host_copy(v) for v in obj)
    return copy.deepcopy(obj)


class Checkpointer:
    """The checkpoints of one run directory, for one rank.

    Args:
        root: ``RUN/checkpoints``.
        cfg: the ``checkpoints`` section, a typed node (``every``: steps between checkpoints, 0 only a
            final one, -1 none; ``every_minutes``: a checkpoint every this many minutes of
            training time, 0 off; ``at_minutes``: extra checkpoints at these training-time
            marks; ``keep``; ``background``: periodic saves written in the background).
        strategy: writes and reads the model files, names the main rank, holds the barrier.
        hashes: config hashes recorded in the manifest; resume refuses a checkpoint whose
            hashes differ (:func:`distnerf.checkpoint.check_compatible`).
    """

    def __init__(self, root: Path, cfg, strategy, hashes: dict):
        self.root, self.cfg, self.strategy, self.hashes = Path(root), typed(CheckpointsConfig, cfg), strategy, hashes
        self.env = strategy.env
        self.marks: list[float] = []  # training-time marks (s) still ahead
        self.period = 60.0 * float(self.cfg.every_minutes)  # s of training time; 0: off
        self.next_periodic = math.inf
        self._pending: tuple[threading.Thread, dict] | None = None
        # the background commit's collectives run on a group of their own (collective: every rank builds
        # its Checkpointer at the same point of set-up)
        self.commit_env = D.new_host_group(self.env) if self.cfg.background else self.env

    def start(self, train_seconds: float) -> None:
        """Arm the time marks still ahead of ``train_seconds`` (a resumed run skips those passed) and
        the periodic cadence's next multiple of ``every_minutes``."""
        self.marks = [m for m in sorted(60.0 * float(m) for m in self.cfg.at_minutes) if m > train_seconds]
        if self.period > 0:
            self.next_periodic = (math.floor(train_seconds / self.period) + 1) * self.period

    def _next_due(self) -> float:
        return min(self.marks[0] if self.marks else math.inf, self.next_periodic)

    def mark_passed(self, train_seconds: float) -> bool:
        """Whether this rank's training time passed the next mark or multiple of ``every_minutes``
        (a per-step flag all ranks agree on)."""
        return train_seconds >= self._next_due()

    def _consume_due(self, train_seconds: float) -> None:
        """A save answers the next mark (it may be another rank's that passed it: consumed on every
        rank alike) and every mark this rank has passed too (a long step skips no save, makes no second)."""
        while True:
            due = self._next_due()
            if math.isinf(due):
                return
            if self.marks and self.marks[0] == due:
                self.marks.pop(0)
            else:
                self.next_periodic += self.period
            if self._next_due() > train_seconds:
                return

    def due(self, step: int) -> bool:
        """Whether the ``every`` cadence saves after ``step`` steps."""
        return self.cfg.every > 0 and step % self.cfg.every == 0

    def final_wanted(self, stop_reason: str) -> bool:
        """A final checkpoint, unless ``every=-1``; always after a stop signal."""
        return self.cfg.every >= 0 or stop_reason == "signal"

    def save(self, step: int, train_seconds: float, model, optimizer, sampler, budget_state: dict,
             at_mark: bool = False, background: bool = False) -> Path:
        """Write ``step_N/`` (collective): the strategy's model files, this rank's RNG and
        sampler state, then, after every rank's outcome is known, the manifest (the commit) and pruning.

        ``at_mark``: this save answers a time mark (the mark is consumed). ``budget_state``: the
        time budget's clock (:meth:`distnerf.components.schedule.BudgetClock.state_dict`:
        ``budget_fraction``, ``budget_minutes``), saved in the trainer state and restored on resume.
        ``background`` (with ``checkpoints.background``): return after the host copy; the files are written
        and committed by a thread (module docstring), and the directory is committed only later.

        Raises:
            CheckpointWriteError: this checkpoint (or the previous background one) was not committed,
                naming each rank's cause and the last committed checkpoint, which is intact.
        """
        if at_mark:
            self._consume_due(train_seconds)
        self.wait()  # one write in flight; a failed one stops the run here, on every rank
        d = ckpt.step_dir(self.root, step)
        files, failed = [], None
        try:
            d.mkdir(parents=True, exist_ok=True)
            self.strategy.save_model_state(d, model, optimizer, {"step": step, "train_seconds": train_seconds,
                                                                 **budget_state},
                                           write=lambda obj, path: files.append((path, host_copy(obj))))
            # the next batch is the one of `step` even when a stop came after drawing it (signal, time budget)
            files.append((d / ckpt.rank_file(self.env.rank),
                          host_copy({"rng": D.rng_state(), "rank": self.env.rank,
                                     "sampler": {**sampler.state_dict(), "next_step": step}})))
        except OSError as err:
            failed = str(err)
        job = {"dir": d, "step": step, "files": files, "failed": failed, "error": None}
        if background and self.cfg.background:
            thread = threading.Thread(target=self._write_and_commit, args=(job,), name=f"checkpoint-{step}",
                                      daemon=True)  # a dying process is not held by it: its directory stays uncommitted
            thread.start()
            self._pending = (thread, job)
        else:
            self._write_and_commit(job)
            if job["error"] is not None:
                raise job["error"]
        return d

    def wait(self) -> None:
        """Wait for the background write in flight, if any (collective once it commits).

        Raises:
            CheckpointWriteError: it was not committed (the message names the last committed one).
            RuntimeError: a collective of its commit failed (a peer lost).
        """
        if self._pending is None:
            return
        thread, job = self._pending
        thread.join()
        self._pending = None
        if job["error"] is not None:
            raise job["error"]

    def close(self, timeout_s: float = 60.0) -> None:
        """At the end of a run that stopped without a final save: give the background write in flight
        up to ``timeout_s`` to commit (its failure is logged, not raised); one still running after that
        is left uncommitted, which resume ignores."""
        if self._pending is None:
            return
        thread, job = self._pending
        thread.join(timeout_s)
        if thread.is_alive():
            log.warning("checkpoint %s still being written after %.0f s at exit: left uncommitted", job["dir"],
                        timeout_s)
        self._pending = None

    def _write_and_commit(self, job: dict) -> None:
        """Write ``job``'s files, agree on every rank's outcome, commit (main rank) or remove the
        directory; the outcome goes to ``job["error"]`` (None: committed). Runs in the background
        thread (collectives on :attr:`commit_env`'s own group) or in the caller's."""
        d, failed = job["dir"], job["failed"]
        try:
            if failed is None:
                try:
                    for path, state in job["files"]:
                        atomic_torch_save(state, path)
                except (CheckpointWriteError, OSError) as err:
                    failed = str(err)
            job["files"] = None  # the host copy is freed as soon as it is on disk
            # every rank's files are complete (or failed) before the manifest commits them: every rank learns
            # of a failure here (no rank is left waiting in a barrier for a writer that died)
            failures = [(r, e) for r, e in enumerate(D.gather_objects(self.commit_env, failed)) if e]
            if not failures and self.env.is_main:
                try:
                    ckpt.write_manifest(d, job["step"], self.env.world_size, self.hashes,
                                        self.strategy.manifest_extra())
                except CheckpointWriteError as err:
                    failures = [(self.env.rank, str(err))]
            failures = D.broadcast_object(self.commit_env, failures)
        except Exception as err:  # noqa: BLE001 (a collective of the commit failed: raised by wait())
            job["error"] = err
            return
        if failures:
            if self.env.is_main:
                shutil.rmtree(d, ignore_errors=True)  # never committed (no manifest): removed, not mistaken for one
            last = ckpt.latest(self.root)
            job["error"] = CheckpointWriteError(
                f"checkpoint {d} not committed: " + "; ".join(f"rank {r}: {e}" for r, e in failures)
                + (f". The last committed checkpoint, {last}, is intact: resume=true continues from it"
                   if last is not None else ". No earlier checkpoint was committed"))
            if threading.current_thread() is not threading.main_thread():
                log.error("%s (training goes on until the next checkpoint, where the run stops)", job["error"])
            return
        if self.env.is_main:
            ckpt.prune(self.root, self.cfg.keep)

    # ----------------------------------------------------------------- resume
    def find_resume(self, resume: bool) -> Path | None:
        """The newest committed checkpoint to continue from: with ``resume=true``, or always
        after a torchrun restart of the worker group; None otherwise or when there is none.

        Raises:
            CheckpointError: the checkpoint's config hashes differ, or it has another format version.
        """
        restarted = self.env.restart_count > 0
        if not (resume or restarted):
            return None
        if restarted and self.env.is_main:
            log.info("torchrun restart %d: resuming from the newest committed checkpoint", self.env.restart_count)
        found = ckpt.latest(self.root)
        if found is None:
            log.info("resume=true but no committed checkpoint in %s: starting fresh", self.root)
            return None
        manifest = ckpt.read_manifest(found, verify=True)
        ckpt.check_compatible(manifest, self.hashes, found)
        if manifest["world_size"] != self.env.world_size and self.strategy.elastic:
            if self.env.is_main:
                log.info("resuming %s saved at world size %d on world size %d: %s reassigns its work to the ranks "
                         "present; its batches are not keyed by rank, so the continuation is the uninterrupted "
                         "run's", found, manifest["world_size"], self.env.world_size, self.strategy.name)
        elif manifest["world_size"] != self.env.world_size:
            log.warning("resuming %s saved at world size %d on world size %d: the continuation is not "
                        "bit-exact (ray streams and RNG states differ)", found, manifest["world_size"],
                        self.env.world_size)
        return found

    def restore_rank(self, path: Path, sampler, step: int) -> None:
        """This rank's RNG states and sampler stream from ``path`` (when it has this rank's file).

        An elastic strategy resumed at another world size restores no per-rank state: rank
        R's file belonged to another share of the work, and its batches are drawn by step.
        """
        rank_path = path / ckpt.rank_file(self.env.rank)
        if self.strategy.elastic and ckpt.read_manifest(path)["world_size"] != self.env.world_size:
            sampler.load_state_dict({**sampler.state_dict(), "next_step": step})
            return
        if not rank_path.exists():
            return
        rank_state = ckpt.load_file(rank_path)
        D.set_rng_state(rank_state["rng"])
        if "sampler" not in rank_state:
            return
        saved, now = rank_state["sampler"], sampler.state_dict()
        changed = [k for k in ("seed", "stream", "rays_per_batch", "policy") if saved.get(k) != now.get(k)]
        if changed:
            log.warning("%s: sampler %s differ from the checkpoint's (%s vs %s): the continuation draws other "
                        "batches than the uninterrupted run", rank_path, ", ".join(changed),
                        {k: now.get(k) for k in changed}, {k: saved.get(k) for k in changed})
        if saved["next_step"] != step:
            log.warning("%s: sampler state at step %d, model at step %d: drawing from step %d", rank_path,
                        saved["next_step"], step, step)
        sampler.load_state_dict({**saved, "next_step": step})
