"""Which rank stopped making progress: each rank's step and phase, published to the store.

A collective that times out names the rank that *waited* (gloo: "Timed out waiting 600000ms
for recv operation"), not the one that hung. So every rank of a distributed run keeps a
:class:`ProgressBeacon`: a daemon thread that writes the rank's current step and phase (the
step breakdown's phase names, e.g. ``forward``, ``step_sync``; ``setup`` before the first step,
``evaluate`` after the last) and a wall-clock heartbeat to the process group's key-value store
every :data:`INTERVAL_S` seconds. When a collective fails, the rank that saw it reads every
rank's entry (:meth:`ProgressBeacon.describe`) and its error names the rank that is behind:
not heard from (a stopped process, one hung in native code holding the GIL, a dead one), or
at the earliest step and phase while the others wait in a collective further on.

The store is the rendezvous store of the run's attempt (``DistEnv.store``); on NCCL the
collective's own error may never reach Python (the watchdog aborts the process): there, read
the flight recorder's dump (docs/operations.md, "When a run hangs").

The store lives in the torchrun agent of the first node (rank 0's), so it goes with that node.
Each rank therefore also writes its entry to ``RUN/progress/rank_R.json`` (:meth:`ProgressBeacon.record_to`,
:data:`PROGRESS_DIR`): a rank that outlives the store reads the files instead, and says so; the files stay
after the run (on a node-local run directory, each node holds its own ranks' files).
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import threading
import time
from pathlib import Path
from typing import Callable

from ..fileio import atomic_write_text

INTERVAL_S = 5.0  # publish period; "not heard from" means older than 3 periods
STEP_ORDER = ("setup", "input_wait", "copy", "model_update", "graph", "forward", "backward", "regularizer", "optimizer",
              "step_sync", "checkpoint", "evaluate")
PROGRESS_DIR = "progress"
"""``RUN/progress/``: each rank's last entry, ``rank_R.json`` (as in the store, plus ``rank``)."""
"""The phases in the order a step passes them (the step breakdown's names; ``setup`` before
step 0, ``evaluate`` after the last step): a rank at an earlier (step, phase) is behind."""


@dataclasses.dataclass(frozen=True)
class HangReport:
    """What :meth:`ProgressBeacon.report` found when a collective failed.

    Attributes:
        text: one paragraph, each rank's step and phase and the verdict (the failure's message).
        short: one line, e.g. ``rank 1 lost (last heard at step 66 in phase backward)`` (a rank not
            heard from) or ``rank 2 behind (at step 7 in phase forward)``: the live viewer's last status.
    """

    text: str
    short: str


class ProgressBeacon:
    """Publish ``(step, phase, since)`` of this rank every ``interval_s`` seconds.

    Args:
        store: a ``torch.distributed.Store`` shared by the ranks (``DistEnv.store``), or None
            (one process: nothing is published and :meth:`describe` says so).
        rank, world_size: this rank and the number of ranks.
        interval_s: publish period in seconds (> 0).
    """

    def __init__(self, store, rank: int, world_size: int, interval_s: float = INTERVAL_S):
        self.store, self.rank, self.world_size, self.interval_s = store, rank, world_size, interval_s
        self.source: Callable[[], tuple[int | None, str, float]] = lambda: (None, "setup", self._born)
        self._born = time.time()
        self._stop = threading.Event()
        self._writing = threading.Lock()  # publish runs on the thread and on the caller's (watch, record_to): one
        # writer at a time (they share RUN/progress/rank_R.json.tmp)
        self._thread: threading.Thread | None = None
        self.directory: Path | None = None  # record_to
        self.store_lost = False  # a store operation failed: the files alone from then on

    @staticmethod
    def key(rank: int) -> str:
        return f"distnerf_progress/rank_{rank}"

    def file(self, rank: int) -> Path:
        return self.directory / f"rank_{rank}.json"

    def record_to(self, directory: Path) -> None:
        """Also write this rank's entry to ``DIRECTORY/rank_R.json`` at every publish (created; the
        run directory's :data:`PROGRESS_DIR`), and read the others' there when the store is gone."""
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.publish()

    def watch(self, source: Callable[[], tuple[int | None, str, float]]) -> None:
        """Publish what ``source()`` returns from now on: (step, phase name, wall time the phase began)."""
        self.source = source
        self.publish()

    def start(self) -> "ProgressBeacon":
        if (self.store is not None or self.directory is not None) and self._thread is None and self._try_publish():
            self._thread = threading.Thread(target=self._run, name="distnerf-progress", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop and join the thread (before the process group is destroyed and the interpreter exits), and
        forget the watched source: a bound method of the trainer would keep the trainer, its DDP wrapper
        and so the process group alive past :func:`distnerf.distributed.shutdown`."""
        self._stop.set()
        try:
            last_step = self.source()[0]
        except Exception:
            last_step = None
        born = self._born
        self.source = lambda: (None, "stopped", born)
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval_s)
            self._thread = None
        if self.directory is not None:  # the file says the rank ended (not the store: it may hang with its host)
            try:
                with self._writing:
                    atomic_write_text(self.file(self.rank), json.dumps({"rank": self.rank, "step": last_step,
                                      "phase": "stopped", "since": time.time(), "beat": time.time()}))
            except Exception:
                pass

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self._try_publish():
                return

    def _try_publish(self) -> bool:
        """:meth:`publish`; False when nothing is left to publish to."""
        try:
            self.publish()
            return True
        except Exception:  # the store is gone (the agent shut down): the file alone, if any
            return self.store_lost and self.directory is not None

    def publish(self) -> None:
        with self._writing:
            self._publish()

    def _publish(self) -> None:
        step, phase, since = self.source()
        entry = json.dumps({"rank": self.rank, "step": step, "phase": phase, "since": since, "beat": time.time()})
        if self.directory is not None:
            atomic_write_text(self.file(self.rank), entry)
        if self.store is not None and not self.store_lost:
            try:
                self.store.set(self.key(self.rank), entry)
            except Exception:
                self.store_lost = True
                raise

    def read(self) -> dict[int, dict | None]:
        """Every rank's last entry (None: never published, or no readable record), without blocking
        on a missing key: from the store, else (the store unreachable) from the rank's file."""
        out: dict[int, dict | None] = {}
        if self.store is not None and not self.store_lost:
            try:  # a store whose host vanished may not answer at all: wait a few periods, not its timeout
                self.store.set_timeout(datetime.timedelta(seconds=max(5.0, 2 * self.interval_s)))
            except Exception:
                pass
        for r in range(self.world_size):
            out[r] = None
            if self.store is not None and not self.store_lost:
                try:
                    out[r] = json.loads(self.store.get(self.key(r))) if self.store.check([self.key(r)]) else None
                    continue
                except Exception:
                    self.store_lost = True
            if self.directory is not None:
                try:
                    out[r] = json.loads(self.file(r).read_text())
                except (OSError, ValueError):
                    pass
        return out

    def silent(self, entries: dict[int, dict | None], now: float) -> list[int]:
        """Ranks of ``entries`` (:meth:`read`) never heard from, or not for 3 publish periods at ``now``."""
        return [r for r, e in entries.items() if e is None or now - e["beat"] > 3 * self.interval_s]

    def describe(self, now: float | None = None, peer_lost: bool = False) -> str:
        """One paragraph: each rank's step and phase, and which rank(s) stopped making progress
        (:meth:`report`'s ``text``)."""
        return self.report(now, peer_lost).text

    def report(self, now: float | None = None, peer_lost: bool = False) -> HangReport:
        """Which rank(s) stopped making progress, from every rank's step and phase.

        A rank is named when it was not heard from for 3 publish periods (stopped, hung in
        native code holding the GIL, or dead); else the ranks furthest behind in (step, phase
        in :data:`STEP_ORDER`) are named, since the others reached a collective they wait in.
        Wall clocks of different nodes are compared (NTP-synchronised clusters assumed).

        Args:
            now: wall time to judge at (seconds since the epoch); None: now.
            peer_lost: the failure was a peer's closed connection (its process or node died at
                once): the dead rank's last entry is as fresh as the others', and entries lag
                by up to a publish period, so its step says nothing. Wait (up to 4 publish
                periods; the live ranks' threads keep publishing) until a rank falls silent,
                and name that one.
        """
        if self.store is None and self.directory is None:
            return HangReport("no progress store (one process)", "a collective failed")
        entries = self.read()
        if peer_lost:
            deadline = time.monotonic() + 4 * self.interval_s
            while not self.silent(entries, time.time()) and time.monotonic() < deadline:
                time.sleep(self.interval_s / 4)
                entries = self.read()
        now = time.time() if now is None else now
        lines, silent, heard = [], self.silent(entries, now), []
        for r, e in entries.items():
            if e is None and self.store_lost:
                lines.append(f"rank {r}: no record here ({self.file(r)} missing: on a node-local run directory it is "
                             "on that rank's node)" if self.directory is not None else f"rank {r}: no record")
                continue
            if e is None:
                lines.append(f"rank {r}: never reported")
                continue
            lines.append(f"rank {r}: step {e['step'] if e['step'] is not None else 0}, phase {e['phase']} for "
                         f"{now - e['since']:.0f} s (last heard {now - e['beat']:.0f} s ago)")
            order = STEP_ORDER.index(e["phase"]) if e["phase"] in STEP_ORDER else len(STEP_ORDER)
            if r not in silent:
                heard.append(((e["step"] or 0, order), r))
        if silent:
            suspects, why = silent, "not heard from: stopped, hung in native code, or dead"
        elif heard and min(p for p, _ in heard) != max(p for p, _ in heard):
            low = min(p for p, _ in heard)
            suspects, why = [r for p, r in heard if p == low], "behind the others, which wait in a collective"
        else:
            suspects, why = [], "every rank is at the same step and phase"
        verdict = (f"stopped making progress: rank {', '.join(map(str, suspects))} ({why})" if suspects
                   else f"no rank stands out ({why})")
        where = ""
        if self.store_lost:  # the store's host (the first node's torchrun agent) is gone
            where = (f" (the progress store, hosted by the first node's torchrun agent, is unreachable: read from "
                     f"{self.directory}/rank_R.json)" if self.directory is not None else
                     " (the progress store, hosted by the first node's torchrun agent, is unreachable; no files)")
        word, heard = ("lost", "last heard at") if silent else ("behind", "at")
        named = [f"rank {r} {word} (never reported)" if entries[r] is None else
                 f"rank {r} {word} ({heard} step {entries[r]['step'] or 0} in phase {entries[r]['phase']})"
                 for r in suspects]
        short = "; ".join(named) or f"a collective failed ({why})"
        return HangReport(f"{verdict}. Progress of every rank{where}: " + "; ".join(lines), short)
