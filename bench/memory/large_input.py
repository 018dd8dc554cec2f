"""Input larger than memory: train from a Blender-layout set of >= 6 GiB of decoded pixels.

    python -m bench.memory.large_input [--copies 34] [--ranks 2] [--steps 20] [--out PATH]

Builds ``--work/large_lego`` (default ``/tmp/distnerf_large_input``): the lego training frames
of ``../shared/data/nerf_synthetic_half/lego`` replicated ``--copies`` times under new names
(symbolic links to the original PNGs, so the set costs no disk; the poses repeat), with a
few test and validation frames. Then runs ``torchrun --nproc_per_node=RANKS -m distnerf.train``
on it with ``sampler.cache_dir`` (the decoded pixels go to one memory-mapped ``.npy`` file)
and, every 0.5 s, reads ``RssAnon`` (anonymous resident memory: heap, not the mapped cache's
page-cache pages) of every rank and sampler worker from ``/proc/PID/status``.

Writes JSON (``bench/memory/results/large_input/large_input.json`` by default): decoded GiB, the cache
build's wall time and images/s (from its log line), RssAnon max per process, time from start
to the first logged step, and the checks: RssAnon <= 2 GiB per rank, first step within the
decode time + 30 s, and a progress line while the cache built. The cache is removed at the
end (``--keep`` keeps it).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.common import ROOT, default_out, start_meta, write_result

LEGO = ROOT.parent / "shared" / "data" / "nerf_synthetic_half" / "lego"
GIB = 2 ** 30


def replicate_blender(src: Path, dst: Path, copies: int, eval_frames: int = 4) -> int:
    """A Blender-layout scene at ``dst`` whose training split is ``src``'s repeated ``copies`` times
    under new names (``train/r_<i>_<k>.png``, symbolic links), and whose test/val splits are the
    first ``eval_frames`` of ``src``'s. Returns the number of training frames."""
    if dst.exists():
        shutil.rmtree(dst)
    for split in ("train", "test", "val"):
        (dst / split).mkdir(parents=True)
        meta = json.loads((src / f"transforms_{split}.json").read_text())
        frames = []
        rounds = copies if split == "train" else 1
        for k in range(rounds):
            for frame in meta["frames"][: None if split == "train" else eval_frames]:
                name = Path(frame["file_path"]).name
                new = f"{name}_{k}" if split == "train" else name
                os.symlink((src / split / f"{name}.png").resolve(), dst / split / f"{new}.png")
                frames.append({**frame, "file_path": f"./{split}/{new}"})
        (dst / f"transforms_{split}.json").write_text(json.dumps({**meta, "frames": frames}))
    return len(json.loads((dst / "transforms_train.json").read_text())["frames"])


def rss_anon_mib(pid: int) -> float | None:
    """``RssAnon`` of process ``pid`` in MiB (None: gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from ``/proc/*/stat`` parent ids)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def process_role(pid: int) -> str | None:
    """``rank`` (a distnerf.train process), ``worker`` (a sampler worker) or None."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    if "distnerf.train" in cmd and "torch.distributed.run" not in cmd:
        return "rank"
    if "multiprocessing" in cmd or "spawn_main" in cmd or "forkserver" in cmd:
        return "worker"
    return None


class RssWatch(threading.Thread):
    """Samples RssAnon of ``root``'s descendants every ``interval_s``; ``peaks`` maps pid -> (role, MiB)."""

    def __init__(self, root: int, interval_s: float = 0.5):
        super().__init__(daemon=True)
        self.root, self.interval_s, self.peaks, self.samples = root, interval_s, {}, 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            for pid in descendants(self.root):
                role = self.peaks.get(pid, (None,))[0] or process_role(pid)
                mib = rss_anon_mib(pid)
                if role and mib is not None:
                    self.peaks[pid] = (role, max(mib, self.peaks.get(pid, (role, 0.0))[1]))
            self.samples += 1

    def stop(self) -> None:
        self._halt.set()
        self.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=34, help="repeats of lego's 100 training frames (34: 6.1 GiB)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--work", type=Path, default=Path("/tmp/distnerf_large_input"))
    ap.add_argument("--out", type=Path, default=default_out(__file__, "large_input/large_input.json"))
    ap.add_argument("--keep", action="store_true", help="keep the scene and its cache")
    args = ap.parse_args()
    meta = start_meta()
    scene_dir, cache_dir, run_dir = args.work / "large_lego", args.work / "cache", args.work / "run"
    for d in (cache_dir, run_dir):
        shutil.rmtree(d, ignore_errors=True)
    frames = replicate_blender(LEGO, scene_dir, args.copies)
    decoded = frames * 400 * 400 * 3 * 4
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.ranks}",
           "-m", "distnerf.train", "device=cpu", "dataset=blender", f"dataset.root={scene_dir}", f"sampler.cache_dir={cache_dir}",
           "sampler=pipelined", "sampler.num_workers=1", f"train.max_steps={args.steps}", "monitor.log_every=1",
           "checkpoints.every=0", "monitor.progress=false", "eval.enabled=false", "logger.wandb.mode=disabled",
           f"run_dir={run_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watch = RssWatch(proc.pid)
    watch.start()
    lines, first_step_s, progress_lines = [], None, 0
    for line in proc.stdout:
        lines.append(line.rstrip())
        if "pixel cache: decoded" in line:
            progress_lines += 1
        if first_step_s is None and run_dir.joinpath("metrics.jsonl").exists() and any(
                '"loss"' in ln for ln in run_dir.joinpath("metrics.jsonl").read_text().splitlines()):
            first_step_s = time.monotonic() - start
    rc = proc.wait()
    wall = time.monotonic() - start
    watch.stop()
    if first_step_s is None and (run_dir / "metrics.jsonl").exists():
        first_step_s = wall  # only seen at the end (no output line after it)
    built = [ln for ln in lines if re.search(r"pixel cache \S+ built in", ln)]
    build_s = float(re.search(r"built in ([\d.]+) s", built[-1]).group(1)) if built else None
    peaks = sorted(watch.peaks.values())
    rank_peaks = [mib for role, mib in peaks if role == "rank"]
    worker_peaks = [mib for role, mib in peaks if role == "worker"]
    report = {
        "frames": frames, "decoded_gib": decoded / GIB, "ranks": args.ranks, "steps": args.steps, "rc": rc,
        "cache_build_s": build_s, "decode_images_per_s": frames / build_s if build_s else None,
        "progress_lines_while_building": progress_lines, "first_step_s": first_step_s, "wall_s": wall,
        "rss_anon_max_mib_per_rank": rank_peaks, "rss_anon_max_mib_per_worker": worker_peaks,
        "rss_samples": watch.samples,
        "checks": {
            "decoded_at_least_6_gib": decoded >= 6 * GIB,
            "rss_anon_per_rank_at_most_2_gib": bool(rank_peaks) and max(rank_peaks) <= 2048,
            "first_step_within_decode_plus_30_s": (first_step_s is not None and build_s is not None
                                                   and first_step_s <= build_s + 30),  # start-up included
            "progress_visible": progress_lines > 0,
        },
        "log_tail": lines[-30:],
    }
    path = write_result(args.out, report, meta)
    print(json.dumps({k: v for k, v in report.items() if k != "log_tail"}, indent=1))
    print(f"-> {path}")
    if not args.keep:
        shutil.rmtree(args.work, ignore_errors=True)
    sys.exit(rc)


if __name__ == "__main__":
    main()
