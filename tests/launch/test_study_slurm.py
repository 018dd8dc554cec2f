"""The study's Slurm path on the real single-node Slurm (``slurm`` fixture): one
``launch/slurm_train.sbatch`` job per cell, run one at a time (``--dependency=singleton``),
reported when they leave the queue."""
from __future__ import annotations

import json
import subprocess
import sys

import yaml

from tests.conftest import REPO


def test_study_cells_run_as_slurm_jobs_one_at_a_time(slurm, tmp_path):
    cfg = yaml.safe_load((REPO / "conf" / "study" / "smoke.yaml").read_text())
    cfg.update(name="slurm", launcher="slurm", exclude=[], axes={"strategy": ["ddp"], "sampler": ["sync"], "world_size": [1, 2],
                                                     "budget": ["s12"]})
    path, root = tmp_path / "slurm.yaml", tmp_path / "study"
    path.write_text(yaml.safe_dump(cfg))
    env = {**slurm.env, "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-m", "distnerf.study", "run", str(path), str(root)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads((root / "report" / "report.json").read_text())
    assert [c["status"] for c in report["cells"]] == ["done", "done"]
    jobs = []
    for cell in report["cells"]:
        run = root / "cells" / cell["id"]
        record = json.loads((run / "study_cell.json").read_text())
        assert record["launcher"] == "slurm" and record["status"] == "done"
        assert "--dependency=singleton" in record["command"]
        assert f"job {record['job_id']}" in (run / "launch.log").read_text()  # the sbatch script's own output
        jobs.append(record["job_id"])
        assert len(list((run / "profile").glob("rank_*.json"))) == cell["values"]["world_size"]
    # one at a time: the second job started after the first ended
    info = [dict(kv.split("=", 1) for kv in slurm.cmd("scontrol", "show", "job", j, check=False).split() if "=" in kv)
            for j in jobs]
    if all("StartTime" in i and "EndTime" in i for i in info):
        assert info[1]["StartTime"] >= info[0]["EndTime"], info
