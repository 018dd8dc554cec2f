"""Hang reports: which rank stopped making progress, from every rank's published step and phase.

A real ``torch.distributed`` store (HashStore, the in-process one; runs use the rendezvous
TCPStore) and one beacon per simulated rank; the verdicts are checked against the positions
each rank was given, not against the code's own output.
"""
from __future__ import annotations

import json
import time

import torch.distributed as dist

from distnerf.observe.progress import ProgressBeacon


def beacons(positions: dict[int, tuple[int, str]], store=None) -> list[ProgressBeacon]:
    store = store or dist.HashStore()
    out = []
    for rank, (step, phase) in positions.items():
        b = ProgressBeacon(store, rank, len(positions), interval_s=1.0)
        b.watch(lambda s=step, p=phase: (s, p, time.time() - 4.0))  # publishes once
        out.append(b)
    return out


def test_the_rank_behind_the_others_is_named():
    # rank 2 is still in its forward of step 7; ranks 0 and 1 wait in the step's agreement
    found = beacons({0: (7, "step_sync"), 1: (7, "step_sync"), 2: (7, "forward")})[0].report()
    report = found.text
    assert report.startswith("stopped making progress: rank 2 (behind"), report
    assert found.short == "rank 2 behind (at step 7 in phase forward)", found.short  # the live page's line
    assert "rank 2: step 7, phase forward for 4 s" in report and "rank 0: step 7, phase step_sync" in report
    # a rank a step behind (ddp: the others wait in the next step's gradient all-reduce)
    report = beacons({0: (8, "backward"), 1: (7, "optimizer")})[0].describe()
    assert report.startswith("stopped making progress: rank 1 "), report


def test_a_silent_rank_is_named_before_one_that_is_behind():
    store = dist.HashStore()
    # rank 1 is at step 3 like rank 0, but its last beat is 20 s old (a stopped process): the
    # entry its beacon would have written then; rank 2 is behind but alive
    store.set(ProgressBeacon.key(1), json.dumps({"step": 3, "phase": "backward", "since": time.time() - 25,
                                                 "beat": time.time() - 20}))
    b0 = ProgressBeacon(store, 0, 3, interval_s=1.0)
    b0.watch(lambda: (3, "step_sync", time.time()))
    b2 = ProgressBeacon(store, 2, 3, interval_s=1.0)
    b2.watch(lambda: (2, "forward", time.time()))
    report = b0.describe()
    assert report.startswith("stopped making progress: rank 1 (not heard from"), report
    assert "rank 1: step 3, phase backward for 25 s (last heard 20 s ago)" in report, report


def test_no_rank_stands_out_when_all_are_at_one_place_and_a_missing_rank_is_named():
    report = beacons({0: (5, "step_sync"), 1: (5, "step_sync")})[0].describe()
    assert report.startswith("no rank stands out"), report
    store = dist.HashStore()
    b = ProgressBeacon(store, 0, 2, interval_s=1.0)
    b.publish()  # rank 1 never published (still decoding its scene, or never started)
    report = b.describe()
    assert "stopped making progress: rank 1" in report and "rank 1: never reported" in report, report
    assert "rank 0: step 0, phase setup" in report


def test_the_thread_publishes_and_stops():
    store = dist.HashStore()
    b = ProgressBeacon(store, 0, 1, interval_s=0.05)
    state = {"step": 0}
    b.source = lambda: (state["step"], "forward", time.time())
    b.start()
    state["step"] = 41
    time.sleep(0.3)
    assert '"step": 41' in store.get(ProgressBeacon.key(0)).decode()
    b.stop()
    assert b._thread is None


def test_a_peer_that_died_at_once_is_named_once_it_falls_silent():
    """A peer whose process died (gloo: "Connection closed by peer") published a fresh entry a
    moment ago, possibly at a later step than the survivor's lagging one: judged at once, the
    survivor would name itself as behind. With ``peer_lost`` it waits for the dead rank's entry
    to age (3 periods) while its own thread keeps publishing, and names the dead one."""
    store, state = dist.HashStore(), {"step": 7}
    b0 = ProgressBeacon(store, 0, 2, interval_s=0.5)
    b0.source = lambda: (state["step"], "step_sync", time.time())
    b0.start()
    b1 = ProgressBeacon(store, 1, 2, interval_s=0.5)
    b1.watch(lambda: (9, "backward", time.time()))  # its last entry; no thread: it is dead from here
    try:
        assert b0.describe().startswith("stopped making progress: rank 0 (behind"), "the premise"
        start = time.monotonic()
        found = b0.report(peer_lost=True)
        waited = time.monotonic() - start
    finally:
        b0.stop()
    report = found.text
    assert report.startswith("stopped making progress: rank 1 (not heard from"), report
    assert found.short == "rank 1 lost (last heard at step 9 in phase backward)", found.short  # the live page's line
    assert 3 * 0.5 - 0.25 <= waited <= 4 * 0.5 + 0.5, waited  # until its entry is 3 periods old
    assert "rank 1: step 9, phase backward" in report and "rank 0: step 7, phase step_sync" in report, report


class LostStore:
    """The rendezvous store after its host (the first node's torchrun agent) died: every call fails."""

    def __getattr__(self, name):
        def fail(*args, **kwargs):
            raise RuntimeError("Connection reset by peer")
        return fail


def test_rank_0s_node_lost_the_survivor_reads_the_files(tmp_path):
    """Rank 0's node (and with it the store) is gone: rank 1 names rank 0 from its last file entry,
    says where it read it, and its own thread goes on writing its file."""
    store = dist.HashStore()
    b0, b1 = ProgressBeacon(store, 0, 2, interval_s=0.05), ProgressBeacon(store, 1, 2, interval_s=0.05)
    b0.watch(lambda: (12, "forward", time.time() - 30.0))
    b0.record_to(tmp_path)
    entry = json.loads((tmp_path / "rank_0.json").read_text())
    (tmp_path / "rank_0.json").write_text(json.dumps({**entry, "beat": entry["beat"] - 20.0}))  # written 20 s ago
    state = {"step": 13}
    b1.source = lambda: (state["step"], "step_sync", time.time())
    b1.record_to(tmp_path)
    b1.store = LostStore()
    b1.start()
    try:
        state["step"] = 14
        deadline = time.monotonic() + 10.0  # the thread survives the store's loss and keeps the file current
        while time.monotonic() < deadline and json.loads((tmp_path / "rank_1.json").read_text())["step"] != 14:
            time.sleep(0.05)  # (a loaded machine may delay the 0.05 s thread by far more than one period)
        assert json.loads((tmp_path / "rank_1.json").read_text())["step"] == 14
        report = b1.describe()
    finally:
        b1.stop()
    assert report.startswith("stopped making progress: rank 0 (not heard from"), report
    assert f"unreachable: read from {tmp_path}/rank_R.json" in report, report
    assert "rank 0: step 12, phase forward for 30 s (last heard 20 s ago)" in report, report
    # a node-local run directory: rank 0's file is on its own node, and the report says so
    (tmp_path / "rank_0.json").unlink()
    report = b1.describe()
    assert f"rank 0: no record here ({tmp_path}/rank_0.json missing" in report, report


def test_gloo_timeout_texts_are_collective_failures():
    """The texts gloo raised in runs of this suite: a recv that timed out, and the pair closed by a
    timed-out operation, re-raised from DDP's comm-hook callback (seen under load); a plain error is not."""
    from distnerf.distributed.collectives import collective_failure

    assert collective_failure(RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out waiting "
                                           "10000ms for recv operation to complete"))
    assert collective_failure(RuntimeError("Got the following error when running the callback: RuntimeError: "
                                           "Application timeout caused pair closure"))
    assert not collective_failure(RuntimeError("CUDA out of memory"))
    assert not collective_failure(ValueError("Timed out"))


def test_the_thread_and_the_caller_publish_to_the_file_at_once(tmp_path):
    """The thread publishes while the trainer's thread calls ``watch`` (a two-node run once failed its set-up
    with "could not write RUN/progress/rank_0.json": two writers of one temp file). Each write completes and
    the file holds the last step."""
    b = ProgressBeacon(None, 0, 1, interval_s=0.0)  # the thread publishes without pause
    b.record_to(tmp_path / "progress")
    b.start()
    try:
        for step in range(400):
            b.watch(lambda s=step: (s, "forward", time.time()))
    finally:
        b._stop.set()
        b._thread.join()
    b.publish()
    assert json.loads((tmp_path / "progress" / "rank_0.json").read_text())["step"] == 399
