"""A saved W&B workspace comparing ddp and ss runs, built with ``wandb-workspaces`` (docs/wandb.md).

    python tools/wandb_workspace.py --group study-char --keys-from runs/char/cells/ddp-sync-w2-lego-grid-s300-r0
        # offline (the default): writes the workspace's spec to wandb_workspace.json (--out FILE) and says so
    python tools/wandb_workspace.py --group study-char --keys-from RUN --entity ME --save
        # with an API key (wandb login / WANDB_API_KEY) and network: saves it in ENTITY/distnerf, prints its URL
    python tools/wandb_workspace.py --group ddp --group ss_joint --ranks 4 --out ws.json
        # plain training runs are grouped by strategy (logger.wandb.group defaults to it)

The runs shown: those of the ``--group`` W&B groups (a study's cells log into ``study-NAME``; a
training run into its strategy, ``ddp`` / ``ss_independent`` / ``ss_joint``), the study's report
run (job type ``report``) left out; grouped by group, then job type (a study's cells: the
strategy), so every panel draws one line per strategy. Sections:

* Quality: ``loss``, ``psnr``, ``val_psnr`` against ``step`` and against ``train_seconds``;
* Throughput: ``rays_per_s`` against both;
* Ranks: ``rank{R}/step_ms``, ``rank{R}/exposed_comm_ms``, ``rank{R}/input_wait_ms``,
  ``rank{R}/peak_rss_mb``, ``rank{R}/rays_per_s``, every rank in one plot;
* Images: media browsers of the validation (``val/...``), test (``test/...``) and
  ``distnerf.render`` (``render/...``) panels;
* Study: parallel coordinates over the study axes (config keys, ``--axis``) and the
  summaries of ``psnr``, ``val_psnr``, ``rays_per_s``, ``train_seconds``.

``--keys-from RUN`` takes the ranks and the image keys from what a run logged (its offline
``RUN/wandb/offline-run-*`` files, read with wandb's reader) and checks that every key a panel
names is one the run logged (exit 2 naming those missing). Without it the ranks are
``--ranks`` and the image sections are left out (their keys are the views' names).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

SCALARS = ("loss", "psnr", "val_psnr")
"""Quality curves, each against ``step`` and ``train_seconds``."""
X_AXES = ("step", "train_seconds")
RANK_FIGURES = ("step_ms", "exposed_comm_ms", "input_wait_ms", "peak_rss_mb", "rays_per_s")
"""The per-rank figures the trainer gathers to rank 0 (``rank{R}/<figure>``)."""
MEDIA_PREFIXES = ("val/", "test/", "render/")
AXES = ("strategy_label", "world_size", "sampler.name", "model.name", "dataset.name", "train.max_steps")
"""Config keys of the study axes (strategy, world size, sampler, model, scene, budget), W&B's dotted names."""
SUMMARIES = ("psnr", "val_psnr", "rays_per_s", "train_seconds")
RANK_KEY = re.compile(r"^rank(\d+)/")


def logged_keys(run_dir: Path) -> dict:
    """What the run logged to W&B (every offline file of ``RUN/wandb``): {"scalars": set, "media": {key:
    _type}, "config": set of dotted config keys}.

    Raises:
        FileNotFoundError: ``run_dir`` has no ``wandb/offline-run-*/run-*.wandb``.
    """
    from distnerf.observe import wandb_records as W

    files = W.run_files(run_dir)
    if not files:
        raise FileNotFoundError(f"{run_dir}: no wandb/offline-run-*/run-*.wandb (a run with logger.wandb.mode=offline)")
    scalars, media, config = set(), {}, set()
    for path in files:
        records = W.read_records(path)
        for row in W.history(records).values():
            for key, value in row.items():
                if isinstance(value, dict):
                    media[key] = value.get("_type")
                elif not key.startswith("_"):
                    scalars.add(key)
        config |= set(W.flat_config(W.run_config(records)))
    return {"scalars": scalars, "media": media, "config": config}


def build_workspace(groups: list[str], ranks: list[int], media: list[str], axes: list[str], entity: str,
                    project: str, name: str):
    """The ``wandb_workspaces`` Workspace (sections as in the module docstring)."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    def plot(y, x, title):
        return wr.LinePlot(title=title, x=x, y=list(y))

    quality = [plot([m], x, f"{m} vs {x}") for m in SCALARS for x in X_AXES]
    throughput = [plot(["rays_per_s"], x, f"rays_per_s vs {x}") for x in X_AXES]
    per_rank = [plot([f"rank{r}/{fig}" for r in ranks], "step", f"{fig} per rank") for fig in RANK_FIGURES]
    sections = [ws.Section(name="Quality", panels=quality, is_open=True),
                ws.Section(name="Throughput", panels=throughput, is_open=True),
                ws.Section(name="Ranks", panels=per_rank, is_open=True)]
    images = [wr.MediaBrowser(title=prefix.rstrip("/"), media_keys=keys, num_columns=min(len(keys), 4))
              for prefix in MEDIA_PREFIXES if (keys := sorted(k for k in media if k.startswith(prefix)))]
    if images:
        sections.append(ws.Section(name="Images", panels=images, is_open=True))
    columns = [wr.ParallelCoordinatesPlotColumn(metric=wr.Config(a)) for a in axes]
    columns += [wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric(m)) for m in SUMMARIES]
    sections.append(ws.Section(name="Study", panels=[wr.ParallelCoordinatesPlot(title="study axes", columns=columns)],
                               is_open=True))
    runs = ws.RunsetSettings(filters=[ws.Metric("Group").isin(list(groups)), ws.Metric("JobType") != "report"],
                             groupby=[ws.Metric("Group"), ws.Metric("JobType")])
    return ws.Workspace(entity=entity, project=project, name=name, sections=sections, runset_settings=runs,
                        settings=ws.WorkspaceSettings(x_axis="step"))


def referenced_keys(workspace) -> dict:
    """{"history": keys the line plots and media browsers name, "config": config keys, "summary": summary keys}."""
    import wandb_workspaces.reports.v2 as wr

    out = {"history": set(), "config": set(), "summary": set()}
    for section in workspace.sections:
        for panel in section.panels:
            if isinstance(panel, wr.LinePlot):
                out["history"] |= {panel.x, *panel.y}
            elif isinstance(panel, wr.MediaBrowser):
                out["history"] |= set(panel.media_keys)
            elif isinstance(panel, wr.ParallelCoordinatesPlot):
                for col in panel.columns:
                    out["config" if isinstance(col.metric, wr.Config) else "summary"].add(col.metric.name)
    return out


def missing_keys(workspace, logged: dict) -> list[str]:
    """The keys the workspace's panels name that the run did not log (``section:key``)."""
    refs = referenced_keys(workspace)
    history = logged["scalars"] | set(logged["media"])
    return sorted([f"history:{k}" for k in refs["history"] - history]
                  + [f"config:{k}" for k in refs["config"] - logged["config"]]
                  + [f"summary:{k}" for k in refs["summary"] - logged["scalars"]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", action="append", required=True,
                        help="a W&B run group to show (repeatable): study-NAME, or ddp / ss_independent / ss_joint")
    parser.add_argument("--keys-from", type=Path, help="a run directory whose offline W&B files give the keys")
    parser.add_argument("--ranks", type=int, default=2, help="ranks of the per-rank plots without --keys-from")
    parser.add_argument("--axis", action="append", help=f"a study axis's config key (repeatable; default {list(AXES)})")
    parser.add_argument("--project", default="distnerf", help="W&B project (logger.wandb.project)")
    parser.add_argument("--entity", default="", help="W&B entity (--save: default the API key's own)")
    parser.add_argument("--name", help="the workspace's name (default: distnerf GROUP[, GROUP])")
    parser.add_argument("--out", type=Path, default=Path("wandb_workspace.json"), help="the spec's file (offline)")
    parser.add_argument("--save", action="store_true", help="save the workspace in W&B (needs an API key and network)")
    args = parser.parse_args(argv)

    try:
        import wandb_workspaces  # noqa: F401
    except ImportError:
        print("wandb_workspace: needs wandb-workspaces (pip install -e '.[wandb]'; tools/setup_env.sh installs it)",
              file=sys.stderr)
        return 2
    logged = None
    if args.keys_from:
        try:
            logged = logged_keys(args.keys_from)
        except (FileNotFoundError, RuntimeError) as err:
            print(f"wandb_workspace: {err}", file=sys.stderr)
            return 2
        ranks = sorted({int(m.group(1)) for k in logged["scalars"] if (m := RANK_KEY.match(k))})
        media = sorted(k for k, kind in logged["media"].items() if kind in ("image-file", "video-file"))
    else:
        ranks, media = list(range(args.ranks)), []
    workspace = build_workspace(args.group, ranks, media, args.axis or list(AXES), args.entity, args.project,
                                args.name or f"distnerf {', '.join(args.group)}")
    if logged is not None and (missing := missing_keys(workspace, logged)):
        print(f"wandb_workspace: {args.keys_from} did not log {', '.join(missing)} (a panel would stay empty; "
              "--axis picks other config keys)", file=sys.stderr)
        return 2
    if not media:
        print("wandb_workspace: no image sections (their keys are the views' names: give --keys-from RUN)",
              file=sys.stderr)
    if args.save:
        import wandb

        if not args.entity:
            workspace.entity = wandb.Api().default_entity
        workspace.save()  # prints the view's URL
        return 0
    # what save() uploads: the view, its spec dumped as upsert_view2 dumps it
    spec = workspace._to_model().model_dump(mode="json", by_alias=True, exclude_none=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(spec, indent=1) + "\n")
    print(f"wandb_workspace: offline: wrote the workspace's spec to {args.out} (not saved in W&B: run again with "
          "--save, an API key and network, after `wandb sync` of the runs)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
