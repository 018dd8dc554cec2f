"""When checkpoints are written, what goes into one, and how a run resumes from it.

The file names and the manifest are :mod:`distnerf.checkpoint`'s; the strategy writes
and reads the model files (``model.pt`` under ``ddp``, one file per region under
``ss``); this module owns the cadence (``train.ckpt_every``, ``train.ckpt_minutes``,
``train.keep_checkpoints``, the final save) and the per-rank RNG and sampler state.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

from .. import checkpoint as ckpt
from ..fileio import CheckpointWriteError, atomic_torch_save
from .. import dist as D

log = logging.getLogger("distnerf")


class Checkpointer:
    """The checkpoints of one run directory, for one rank.

    Args:
        root: ``RUN/checkpoints``.
        train_cfg: the ``train`` config (``ckpt_every``: steps between checkpoints, 0 only a
            final one, -1 none; ``ckpt_minutes``: extra checkpoints at these training-time
            marks; ``keep_checkpoints``).
        strategy: writes and reads the model files, names the main rank, holds the barrier.
        hashes: config hashes recorded in the manifest; resume refuses a checkpoint whose
            hashes differ (:func:`distnerf.checkpoint.check_compatible`).
    """

    def __init__(self, root: Path, train_cfg, strategy, hashes: dict):
        self.root, self.cfg, self.strategy, self.hashes = Path(root), train_cfg, strategy, hashes
        self.env = strategy.env
        self.marks: list[float] = []  # training-time marks (s) still ahead

    def start(self, train_seconds: float) -> None:
        """Arm the time marks still ahead of ``train_seconds`` (a resumed run skips those passed)."""
        self.marks = [m for m in sorted(60.0 * float(m) for m in self.cfg.ckpt_minutes) if m > train_seconds]

    def mark_passed(self, train_seconds: float) -> bool:
        """Whether this rank's training time passed the next mark (a per-step flag all ranks agree on)."""
        return bool(self.marks) and train_seconds >= self.marks[0]

    def due(self, step: int) -> bool:
        """Whether the ``ckpt_every`` cadence saves after ``step`` steps."""
        return self.cfg.ckpt_every > 0 and step % self.cfg.ckpt_every == 0

    def final_wanted(self, stop_reason: str) -> bool:
        """A final checkpoint, unless ``ckpt_every=-1``; always after a stop signal."""
        return self.cfg.ckpt_every >= 0 or stop_reason == "signal"

    def save(self, step: int, train_seconds: float, model, optimizer, sampler, budget_state: dict,
             at_mark: bool = False) -> Path:
        """Write ``step_N/`` (collective): the strategy's model files, this rank's RNG and
        sampler state, then, after a barrier, the manifest (the commit) and pruning.

        ``at_mark``: this save answers a time mark (the mark is consumed). ``budget_state``: the
        time budget's clock (:meth:`distnerf.components.schedule.BudgetClock.state_dict`:
        ``budget_fraction``, ``budget_minutes``), saved in the trainer state and restored on resume.
        """
        if at_mark:
            self.marks.pop(0)
        d = ckpt.step_dir(self.root, step)
        failed = None
        try:
            d.mkdir(parents=True, exist_ok=True)
            self.strategy.save_model_state(d, model, optimizer, {"step": step, "train_seconds": train_seconds,
                                                                 **budget_state})
            # the next batch is the one of `step` even when a stop came after drawing it (signal, time budget)
            atomic_torch_save({"rng": D.rng_state(), "rank": self.env.rank,
                                    "sampler": {**sampler.state_dict(), "next_step": step}},
                                   d / ckpt.rank_file(self.env.rank))
        except (CheckpointWriteError, OSError) as err:
            failed = str(err)
        # every rank's files are complete (or failed) before the manifest commits them: every rank learns
        # of a failure here (no rank is left waiting in a barrier for a writer that died)
        failures = [(r, e) for r, e in enumerate(D.gather_objects(self.env, failed)) if e]
        if not failures and self.env.is_main:
            try:
                ckpt.write_manifest(d, step, self.env.world_size, self.hashes, self.strategy.manifest_extra())
            except CheckpointWriteError as err:
                failures = [(self.env.rank, str(err))]
        failures = D.broadcast_object(self.env, failures)
        if failures:
            if self.env.is_main:
                shutil.rmtree(d, ignore_errors=True)  # never committed (no manifest): removed, not mistaken for one
            last = ckpt.latest(self.root)
            raise CheckpointWriteError(
                f"checkpoint {d} not committed: " + "; ".join(f"rank {r}: {e}" for r, e in failures)
                + (f". The last committed checkpoint, {last}, is intact: resume=true continues from it"
                   if last is not None else ". No earlier checkpoint was committed"))
        if self.env.is_main:
            ckpt.prune(self.root, self.cfg.keep_checkpoints)
        return d

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
