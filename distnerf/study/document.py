"""The study report as documents: Markdown (``report.md``) and one self-contained HTML page
(``report.html``, the figures embedded), both from the same section tables of a built report
(:func:`distnerf.study.report.build`; or of a committed ``report.json``).
"""
from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from ..fileio import atomic_write_text
from . import capacity
from .collect import BREAKDOWN
from .scaling import FIT_MAX_WORLD_SIZE


def _fmt(v, spec=".3g"):
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def _table(rows: list[dict], cols: list[tuple[str, str, str]]) -> list[str]:
    """Markdown table: cols = (key, header, format spec)."""
    if not rows:
        return ["(no cell of the study gives this table)"]
    out = ["| " + " | ".join(h for _, h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(_fmt(r.get(k), f) for k, _, f in cols) + " |")
    return out


def section_tables(data: dict) -> list[tuple[str, list[str]]]:
    """(title, markdown lines) of every section, shared by the Markdown and the HTML page."""
    t = data["tables"]
    cells = [{**c, "step_ms": 1e3 * c["figures"]["step_s_median"] if c.get("figures") else None,
              "psnr": (c.get("figures") or {}).get("psnr")} for c in data["cells"]]
    out = [("Cells", _table(cells, [("id", "cell", ""), ("status", "status", ""), ("contended", "contended", ""),
                                    ("busy", "busy cores at start", ".2f"), ("load1", "load1 at start", ".2f"), ("mem_available_mb", "free MiB", ".0f"),
                                    ("waited_s", "waited s", ".0f"), ("wall_s", "wall s", ".0f"),
                                    ("step_ms", "step ms", ".1f"), ("psnr", "PSNR", ".2f")]))]
    phase_cols = [(p, p, ".1%") for p in (*BREAKDOWN, "other")]
    out.append(("Training step breakdown (share of the step)",
                _table(t["breakdown"], [("cell", "cell", ""), ("world_size", "W", ""), ("step_ms", "step ms", ".1f"),
                                        *phase_cols])))
    out.append(("Synchronisation cost", _table(t["sync"], [
        ("cell", "cell", ""), ("kind", "kind", ""), ("world_size", "W", ""), ("params_per_rank", "params/rank", ".3g"),
        ("bytes_per_step", "bytes/step/rank", ".3g"), ("exposed_share", "exposed share", ".1%"),
        ("hidden_share_of_comm", "hidden share of comm", ".1%")])))
    out.append(("Inference: fused vs single-model render", _table(t["inference"], [
        ("cell", "cell", ""), ("regions", "K", ""), ("world_size", "W", ""), ("fused_s_per_view", "fused s/view", ".3g"),
        ("single_s_per_view", "single s/view", ".3g"), ("fused_over_single", "fused/single", ".2f"),
        ("routing_share", "routing", ".1%"), ("exchange_composite_share", "exchange+compositing", ".1%")])))
    out.append(("Input: stall share and pipelining", _table(t["input"], [
        ("cell", "cell", ""), ("sampler", "sampler", ""), ("world_size", "W", ""), ("step_ms", "step ms", ".1f"),
        ("input_stall_share", "input_wait share", ".1%"), ("speedup_over_sync", "speedup vs sync", ".2f"),
        ("ideal_bound", "ideal T/(T-S)", ".2f"), ("capacity_bound", "capacity bound", ".2f")])))
    out.append(("Quality at the budget", _table(t["quality"], [
        ("cell", "cell", ""), ("n", "n", ""), ("psnr", "PSNR dB (median)", ".2f"), ("psnr_mean", "mean", ".2f"),
        ("psnr_sd", "sd (seeds)", ".2f"), ("ssim", "SSIM", ".4f"),
        ("steps_s", "training s", ".0f"), ("params_per_rank", "params/rank", ".3g"),
        ("peak_rss_mb", "peak RSS MiB", ".0f")])))
    if t.get("capacity") or t.get("ranks"):
        targets = ["", "Targets:", *[f"- {v}" for v in t.get("verdicts", [])]]
        out.append(("Capacity: test PSNR against parameters per rank (ddp, W = 1)", _table(t["capacity"], [
            ("context", "context", ""), ("budget", "budget", ""), ("params_per_rank", "params/rank", ".3g"), ("n", "n (seeds)", ""),
            ("psnr_mean", "PSNR mean dB", ".2f"), ("psnr_sd", "sd", ".2f"),
            ("db_per_doubling", "dB per doubling (from previous)", "+.2f"),
            ("db_per_doubling_around", "dB per doubling (around)", "+.2f"), ("steps", "steps", ".0f"),
            ("gain_last_max", f"gain over last {capacity.PLATEAU_FRACTION:.0%} of steps (max over seeds, val dB)",
             "+.2f"), ("lr_share_min", "lr there (x start, min over seeds)", ".3f"),
            ("plateau", f"plateau (< {capacity.PLATEAU_GAIN_DB} dB, lr >= {capacity.PLATEAU_MIN_LR_SHARE} x start)", ""),
            ("constant_psnr", "constant-colour PSNR", ".2f")]) + ([] if t.get("ranks") else targets)))
    if t.get("ranks"):  # a curve alone (conf/study/capacity_plateau.yaml) has its targets under the curve
        out.append(("Quality against ranks (equal steps, equal rays per rank per step)", _table(t["ranks"], [
            ("context", "context", ""), ("budget", "budget", ""), ("strategy", "strategy", ""), ("world_size", "W", ""),
            ("n", "n (seeds)", ""),
            ("psnr_mean", "PSNR mean dB", ".2f"), ("psnr_sd", "sd", ".2f"),
            ("db_per_doubling", "dB per doubling of ranks", "+.2f"), ("delta_vs_w1", "vs W = 1 dB", "+.2f"),
            ("steps", "steps", ".0f"), ("single_equal_total_psnr", "one rank, W x the params, same steps (dB)", ".2f"),
            ("vs_single_equal_total", "vs that", "+.2f"), ("params_per_rank", "params/rank", ".3g"),
            ("segments_per_ray", "segments per ray", ".2f"), ("step_ms", "step ms (median)", ".1f"),
            ("source", "cell", "")]) + targets))
    sc, chk = t["scaling"], t["scaling_check"]
    if sc:
        inp = sc["inputs"]
        mode = sc.get("mode", "strong")  # a report.json written before weak scaling existed was strong-scaled
        device = inp.get("device", "measured: the study's world-size-1 ddp cell on this machine")
        fixed = inp.get("fixed_s_per_step") or 0.0
        lines = [f"Device speed (an input): {inp['compute_s_per_ray']:.3g} s per training ray per device"
                 + (f" plus {fixed:.3g} s per step" if fixed else "") + f" ({device}); {mode} scaling"
                 + (f" at {inp.get('rays_per_rank') or inp['global_rays']} rays per rank." if mode == "weak" else
                    f" of {inp['global_rays']} rays per step."), "",
                 "Inputs (measured): " + ", ".join(f"{k} = {_fmt(v)}" for k, v in inp.items() if k != "device"), "",
                 "Assumptions:", *[f"- {a}" for a in sc["assumptions"]],
                 *[f"- {k}: {ic['note']}" for k, ic in sc["interconnects"].items()], ""]
        rows = [{"interconnect": name, "N": p["world_size"], "ddp": 1e3 * p["ddp"]["step_s"],
                 "ddp_exposed": 1e3 * p["ddp"]["exposed_comm_s"], "ssi": 1e3 * p["ss_independent"]["step_s"],
                 "ssj": 1e3 * p["ss_joint"]["step_s"], "fused": p["fused_over_single"]}
                for name, preds in sc["predictions"].items() for p in preds]
        lines += _table(rows, [("interconnect", "interconnect", ""), ("N", "GPUs", ""), ("ddp", "ddp ms", ".3g"),
                               ("ddp_exposed", "ddp exposed ms", ".3g"), ("ssi", "ss indep. ms", ".3g"),
                               ("ssj", "ss joint ms", ".3g"), ("fused", "fused/single", ".3g")])
        lines += ["", f"Check out of sample: fitted at W <= {FIT_MAX_WORLD_SIZE}, predicting the measured cells above "
                  f"(host collectives: {chk['host_collectives'] or 'not fitted'}; tolerance {chk['tolerance']:.0%}; "
                  "a miss is printed as within = False):", ""]
        checked = [r for r in chk["rows"] if r["world_size"] > FIT_MAX_WORLD_SIZE]  # older reports: in sample too
        if not checked:
            lines.append(f"(not run: the study has no finished cell at W > {FIT_MAX_WORLD_SIZE} beside its "
                         "world-size-1 ddp cell)")
        lines += [] if not checked else _table(checked, [("strategy", "strategy", ""), ("world_size", "W", ""),
                                      ("step_s", "measured s", ".4f"), ("predicted_s", "predicted s", ".4f"),
                                      ("relative_error", "error", "+.1%"), ("within", "within", "")])
        out.append(("Scaling model (past this machine, on paper)", lines))
    else:
        out.append(("Scaling model (past this machine, on paper)",
                    ["(needs a finished ddp cell at world size 1)"]))
    diff = t["differs"]
    out.append(("What differs (undeclared settings)", _table(diff, [
        ("cell", "cell", ""), ("against", "against", ""), ("key", "setting", ""), ("there", "there", ""),
        ("here", "in the cell", "")]) if diff else [
        "every finished cell differs from the first only in declared settings: " + ", ".join(data["declared"])]))
    return out


def to_markdown(data: dict, figure_names: list[str]) -> str:
    s = data["study"]
    lines = [f"# Study `{s['name']}`", "", s.get("description") or "", "",
             f"Cells: {len(data['cells'])} ({', '.join(f'{v} {k}' for k, v in data['status'].items())}); "
             f"repeats {s['repeats']}; timed: {s['timed']}; study directory `{data['study_dir']}`.", "",
             timing_line(data.get("timing")), ""]
    for title, body in section_tables(data):
        lines += [f"## {title}", "", *body, ""]
    for name in figure_names:
        lines.append(f"![{name}]({name})")
    return "\n".join(lines) + "\n"


def timing_line(t: dict | None) -> str:
    if not t or not t.get("first_cell_started"):
        return "Wall time: no cell has run."
    return (f"Wall time: cells from {t['first_cell_started']} to {t['last_cell_finished'] or '(running)'}; "
            f"{t['cells_wall_s'] / 60:.1f} min in the cells, {t['waited_s'] / 60:.1f} min waiting for a quiet machine.")


def _md_table_to_html(lines: list[str]) -> str:
    out, rows = [], [ln for ln in lines if ln.startswith("|") and not ln.startswith("|---")]
    if not rows:
        return "".join(f"<p>{html.escape(ln)}</p>" for ln in lines if ln)
    out.append("<table>")
    for i, r in enumerate(rows):
        tag = "th" if i == 0 else "td"
        out.append("<tr>" + "".join(f"<{tag}>{html.escape(c.strip())}</{tag}>" for c in r.strip("|").split("|"))
                   + "</tr>")
    out.append("</table>")
    rest = [ln for ln in lines if not ln.startswith("|")]
    return "".join(f"<p>{html.escape(ln)}</p>" for ln in rest if ln) + "".join(out)


def to_html(data: dict, figs: list[Path]) -> str:
    s = data["study"]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>study {html.escape(s['name'])}</title>",
             "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}table{border-collapse:collapse;"
             "font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}</style></head><body>",
             f"<h1>Study {html.escape(s['name'])}</h1><p>{html.escape(s.get('description') or '')}</p>",
             f"<p>{html.escape(timing_line(data.get('timing')))}</p>"]
    for title, body in section_tables(data):
        parts.append(f"<h2>{html.escape(title)}</h2>{_md_table_to_html(body)}")
    parts.append("<h2>Figures</h2>")
    for f in figs:
        data64 = base64.b64encode(f.read_bytes()).decode()
        parts.append(f"<p><a href='{f.name}'><img alt='{f.name}' src='data:image/png;base64,{data64}'></a></p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html_from_json(report_json: Path) -> Path:
    """``report.html`` beside a committed ``report.json`` (a report without its runs): the page
    :func:`write_report` writes, from the JSON and the figures it names beside it.

    Raises:
        FileNotFoundError: a figure the JSON names is missing (each named).
    """
    data = json.loads(Path(report_json).read_text())
    figs = [Path(report_json).parent / name for name in data.get("figures", [])]
    missing = [str(f) for f in figs if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"{report_json}: figures it names are missing: {', '.join(missing)}")
    out = Path(report_json).parent / "report.html"
    atomic_write_text(out, to_html(data, figs))
    return out


