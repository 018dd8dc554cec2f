"""The runs W&B wrote offline (``RUN/wandb/offline-run-*/run-*.wandb``), read with wandb's own reader.

wandb keeps a run's records in a transaction log (LevelDB's log framing around its protobuf
``Record`` messages). Since wandb moved its internal process to the Go ``wandb-core``, the Python
SDK holds no reader of that file (``wandb.sdk.internal.datastore`` is gone in 0.31); the reader is
wandb-core's, exposed as ``wandb leet inspect --json PATH``: one JSON object per record,
``{"num", "type", "<type>": {...}}``, where a history or summary item's nested keys are joined by
``.`` (an image ``val/r_0`` gives ``val/r_0._type``, ``val/r_0.width``, ...). distnerf's keys hold
no ``.``, so the first ``.`` splits a media key from its field.

Used by ``tools/wandb_workspace.py`` (the keys a run logged) and the tests of the W&B dashboards.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def run_files(run_dir: Path) -> list[Path]:
    """The ``run-<id>.wandb`` files of ``RUN/wandb/offline-run-*/`` (and ``run-*/``, an online run's),
    oldest first (a training run's, then those of a restart or of ``distnerf.render`` logging into the
    same run: the order ``wandb sync`` uploads them in)."""
    found = Path(run_dir).glob("wandb/*run-*/run-*.wandb")
    return sorted(found, key=lambda p: p.parent.name.split("run-", 1)[1])  # the folder's start time stamp


def read_records(path: Path, timeout: float = 120.0) -> list[dict]:
    """Every record of one ``.wandb`` file, in order (``wandb leet inspect --json``).

    Raises:
        FileNotFoundError: no such file.
        RuntimeError: the reader failed (its message, naming the file), e.g. a wandb without
            ``leet inspect`` (this project tests wandb 0.31).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such .wandb file")
    env = {**os.environ, "WANDB_MODE": "offline"}  # offline: the reader uploads no telemetry
    proc = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{path}: `wandb leet inspect --json` failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def _nest(items: dict) -> dict:
    """``{"val/r_0.width": 72, "loss": 0.1}`` -> ``{"val/r_0": {"width": 72}, "loss": 0.1}``."""
    out: dict = {}
    for key, value in items.items():
        head, dot, field = key.partition(".")
        if dot:
            out.setdefault(head, {})[field] = value
        else:
            out[key] = value
    return out


def history(records: list[dict]) -> dict[int, dict]:
    """{W&B step: {key: value}} of the history records; a media value is a dict of its fields
    (``_type`` ``image-file`` / ``video-file`` / ``table-file``, ``path`` under the run's ``files/``, ...)."""
    out: dict[int, dict] = {}
    for r in records:
        if r["type"] == "history":
            row = _nest(r["history"]["item"])
            out.setdefault(row.get("_step"), {}).update(row)
    return out


def run_meta(records: list[dict]) -> dict:
    """The run record: ``run_id``, ``run_group``, ``job_type``, ``project``, ``display_name``, ... (no config)."""
    run = next(r["run"] for r in records if r["type"] == "run")
    return {k: v for k, v in run.items() if k != "config"}


def run_config(records: list[dict]) -> dict:
    """The run's config (nested dicts), the run record's then every config update over it; wandb's own
    ``_wandb`` entry left out."""
    config: dict = {}
    for r in records:
        update = (r["run"].get("config") if r["type"] == "run" else r["config"] if r["type"] == "config" else None)
        config.update((update or {}).get("update") or {})
    config.pop("_wandb", None)
    return config


def flat_config(config: dict, prefix: str = "") -> dict:
    """``{"sampler": {"name": "sync"}}`` -> ``{"sampler.name": "sync"}``: W&B's names for nested config keys."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(flat_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def uploaded_files(records: list[dict]) -> set[str]:
    """The paths (relative to the run's ``files/``) the run's files records name: what ``wandb sync`` uploads."""
    return {f["path"] for r in records if r["type"] == "files" for f in r["files"].get("files", [])}
