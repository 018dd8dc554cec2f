"""What the live web viewer costs training, and how long a frame takes (issue 27).

    python -m bench.throughput.viewer live  [--repeats 2] [--steps 1000] [--out bench/throughput/results/viewer/live.json]
    python -m bench.throughput.viewer frame RUN_DIR [--size 400] [--frames 5] [--out bench/throughput/results/viewer/frame.json]

``live``: the README main job (``python -m distnerf.train``: the built-in objects scene, 1000 steps,
1 process), alternately with the viewer off and with ``viewer.enabled=true`` and one client: a
headless Debian ``chromium`` (driven by playwright, software WebGL) that opens the page once the
server is up and stays on it, its camera still (the live view re-renders the current model every
second, within ``viewer.max_render_share``). The figure is the training loop's effective rate:
steps x rays per step / the loop's wall seconds (the trainer's log line ``training stopped ... (L s
of wall time in the loop)``), so time spent rendering frames between steps counts against it;
the per-step rate (rendering excluded) is recorded beside it. The browser stands in for a user's
remote machine: its processes are reniced to 19 and their CPU seconds are recorded (on this
2-core machine they compete with training, which a remote client does not). ``--client-cpu F``:
once the page shows the live view, the browser's processes move into a cgroup (v1 ``cpu``
controller, root) whose CFS quota is F of one core and whose weight is the lowest (``cpu.shares``
2): a client elsewhere, whose own CPU no longer competes with training, while the server side
(rendering, encoding, the websocket) is paid in full as before. ``--share S`` passes ``viewer.max_render_share=S`` (default: the schema's).

``frame``: the viewer's render of a still frame of a run's model (``distnerf.view``'s code:
:func:`distnerf.engine.evaluate.render_image` of :func:`distnerf.viewer.frames.single_view`), at SIZE x SIZE from the first test camera's pose and
field of view, FRAMES times after one warm-up; median seconds and rays/s.

Writes JSON with the ``meta`` block of ``bench.common``. Run it alone through ``../shared/tools/quiet``.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, default_out, free_port, start_meta, write_result

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--use-angle=swiftshader", "--enable-unsafe-swiftshader", "--ignore-gpu-blocklist"]
STOP_LINE = re.compile(r"training stopped at step (\d+) \(\w+\) after ([\d.]+) s of training \(([\d.]+) s of wall time")
SHARE_LINE = re.compile(r"viewer: (\d+) frames rendered in ([\d.]+) s, ([\d.]+)% of [\d.]+ s "
                        r"\(viewer.max_render_share=([\d.]+)\)")


def chromium_cpu_seconds(pids: set[int]) -> float:
    """User + system CPU seconds of the processes ``pids`` (those still alive), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14, 15 of stat)
    return total


def chromium_pids() -> set[int]:
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"chrom" in (entry / "cmdline").read_bytes().split(b"\0")[0]:
                    pids.add(int(entry.name))
            except OSError:
                pass
    return pids


CGROUP_CPU = Path("/sys/fs/cgroup/cpu")


def cpu_group(fraction: float) -> Path:
    """A new cgroup (v1 ``cpu``) capped at ``fraction`` of one core, with the lowest weight.

    Raises:
        RuntimeError: no writable cgroup v1 ``cpu`` hierarchy at /sys/fs/cgroup/cpu (root needed).
    """
    group = CGROUP_CPU / f"bench_viewer_client_{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        period = int((group / "cpu.cfs_period_us").read_text())
        (group / "cpu.cfs_quota_us").write_text(str(max(1000, int(fraction * period))))
        (group / "cpu.shares").write_text("2")
    except OSError as e:
        raise RuntimeError(f"--client-cpu needs a writable cgroup v1 cpu hierarchy at {CGROUP_CPU} (root): {e}")
    return group


def move_to_group(group: Path, pids: set[int]) -> None:
    """Move ``pids`` into ``group`` (their later children start there too)."""
    for pid in pids:
        try:
            (group / "cgroup.procs").write_text(str(pid))
        except OSError:  # gone meanwhile
            pass


def remove_groups() -> None:
    for group in CGROUP_CPU.glob(f"bench_viewer_client_{os.getpid()}"):
        try:
            group.rmdir()  # empty once its processes have ended
        except OSError:
            pass


def train_once(run_dir: Path, steps: int, viewer: bool, client_cpu: float | None = None,
               share: float | None = None) -> dict:
    port = free_port()
    args = [sys.executable, "-m", "distnerf.train", f"run_dir={run_dir}", f"train.max_steps={steps}",
            "monitor.progress=false", "logger.wandb.mode=disabled"]
    if viewer:
        args += ["viewer.enabled=true", f"viewer.port={port}"]
        if share is not None:
            args.append(f"viewer.max_render_share={share}")
    started = time.time()
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    client = {}
    browser = pw = None
    try:
        if viewer:
            from playwright.sync_api import sync_playwright

            pw = sync_playwright().start()
            before = chromium_pids()
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            pids = chromium_pids() - before
            for pid in pids:
                try:
                    os.setpriority(os.PRIO_PROCESS, pid, 19)
                except OSError:
                    pass
            page = browser.new_page(viewport={"width": 800, "height": 800}, device_scale_factor=1)
            deadline = time.monotonic() + 600
            while True:  # the server comes up once training has built its model
                try:
                    page.goto(f"http://localhost:{port}")
                    break
                except Exception:  # noqa: BLE001  (connection refused until then)
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("training ended before its viewer served a page")
                    time.sleep(0.5)
            page.wait_for_function("document.body.innerText.includes('live')", timeout=600_000)
            client["connected_after_s"] = round(time.time() - started, 1)
            if client_cpu is not None:  # the page is up: from here the browser stands for a remote one
                move_to_group(cpu_group(client_cpu), chromium_pids())
        out = proc.communicate(timeout=3600)[0]
    finally:
        if browser is not None:
            pids = chromium_pids()
            client["chromium_cpu_s"] = round(chromium_cpu_seconds(pids), 1)
            browser.close()
        if pw is not None:
            pw.stop()
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0:
        raise RuntimeError(f"training failed ({proc.returncode}):\n{out[-3000:]}")
    stop = STOP_LINE.search(out)
    if stop is None:
        raise RuntimeError(f"no 'training stopped ... wall time' line in the log:\n{out[-3000:]}")
    step, train_s, loop_s = int(stop.group(1)), float(stop.group(2)), float(stop.group(3))
    rays = _rays_per_step(out)
    row = {"viewer": viewer, "steps": step, "rays_per_step": rays, "train_seconds": train_s, "loop_wall_s": loop_s,
           "loop_rays_per_s": step * rays / loop_s, "step_rays_per_s": step * rays / train_s,
           "process_wall_s": round(time.time() - started, 1), **client}
    share = SHARE_LINE.search(out)
    if share is not None:
        row.update(frames=int(share.group(1)), render_s=float(share.group(2)), render_share_pct=float(share.group(3)),
                   max_render_share=float(share.group(4)))
    elif viewer:
        raise RuntimeError(f"viewer on but no 'frames rendered' line:\n{out[-3000:]}")
    print({k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    return row


def _rays_per_step(log: str) -> int:
    found = re.search(r"global batch (\d+) rays", log)
    if found is None:
        raise RuntimeError("no 'global batch N rays' line in the log")
    return int(found.group(1))


def live(args) -> None:
    meta = start_meta()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_viewer_") as tmp:
        for r in range(args.repeats):
            for viewer in (False, True):
                rows.append({"repeat": r, **train_once(Path(tmp) / f"run{r}_{int(viewer)}", args.steps, viewer,
                                                       args.client_cpu, args.share)})
    remove_groups()
    summary = {"client_cpu": args.client_cpu, "max_render_share": args.share}
    for viewer in (False, True):
        cell = [x for x in rows if x["viewer"] == viewer]
        summary["on" if viewer else "off"] = {
            "loop_rays_per_s_median": statistics.median(x["loop_rays_per_s"] for x in cell),
            "step_rays_per_s_median": statistics.median(x["step_rays_per_s"] for x in cell), "n": len(cell)}
    summary["slowdown_pct"] = 100.0 * (1.0 - summary["on"]["loop_rays_per_s_median"]
                                       / summary["off"]["loop_rays_per_s_median"])
    print(f"viewer off {summary['off']['loop_rays_per_s_median']:.0f} rays/s, on (one client) "
          f"{summary['on']['loop_rays_per_s_median']:.0f} rays/s: {summary['slowdown_pct']:.1f}% slower")
    write_result(args.out or default_out(__file__, "viewer") / "live.json", {"summary": summary, "rows": rows}, meta)


def frame(args) -> None:
    import numpy as np
    import torch

    from distnerf import distributed as D
    from distnerf.data import load_scene
    from distnerf.data.images import undecoded
    from distnerf.engine.runs import load_renderer, load_run_config
    from distnerf.engine.evaluate import render_image
    from distnerf.viewer.frames import pinhole, single_view

    meta = start_meta()
    cfg, run_dir = load_run_config([f"run_dir={args.run_dir}", "device=cpu"], prog="bench_viewer")
    env = D.init_distributed("cpu", timeout_s=cfg.dist_timeout_s, setup_timeout_s=cfg.dist_setup_timeout_s)
    scene = load_scene(cfg.dataset, "test", pixels=undecoded)
    renderer, step = load_renderer(cfg, run_dir, scene, env)
    cams = scene.cameras
    c2w = cams.c2w[0].numpy()
    fov = float(2 * np.arctan(0.5 * cams.height / float(cams.fy[0])))
    camera = pinhole(c2w, fov, args.size, args.size)
    seconds = []
    with torch.no_grad():
        for k in range(args.frames + 1):
            t0 = time.perf_counter()
            render_image(renderer, single_view(scene, camera), 0, cfg.eval.chunk, env.device, cfg.eval.point_chunk)
            if k:  # the first is a warm-up
                seconds.append(time.perf_counter() - t0)
    median = statistics.median(seconds)
    report = {"run_dir": str(args.run_dir), "step": step, "size": args.size, "frames": args.frames,
              "seconds": seconds, "seconds_median": median, "rays_per_s_median": args.size ** 2 / median,
              "torch_threads": torch.get_num_threads()}
    print(f"{args.size}x{args.size} frame of {args.run_dir} (step {step}): {median:.3f} s median "
          f"({args.size ** 2 / median:,.0f} rays/s) over {args.frames}")
    write_result(args.out or default_out(__file__, "viewer") / "frame.json", report, meta)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("live", help="training rays/s with the live viewer off and on (one client)")
    a.add_argument("--repeats", type=int, default=2)
    a.add_argument("--steps", type=int, default=1000)
    a.add_argument("--out", type=Path, default=None)
    a.add_argument("--client-cpu", type=float, default=None,
                   help="cap the browser at this fraction of one core (a cgroup; emulates a remote client)")
    a.add_argument("--share", type=float, default=None, help="viewer.max_render_share (default: the schema's)")
    f = sub.add_parser("frame", help="the viewer's still-frame time of a run's model")
    f.add_argument("run_dir", type=Path)
    f.add_argument("--size", type=int, default=400)
    f.add_argument("--frames", type=int, default=5)
    f.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    live(args) if args.cmd == "live" else frame(args)


if __name__ == "__main__":
    main()
