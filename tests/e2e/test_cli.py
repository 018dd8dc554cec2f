"""Every entry point's command line, as a newcomer meets it: ``--help`` (usage, the keys it reads,
examples; exit 0) and a missing or wrong argument (one line naming it, exit 2, no traceback).

The entries run in-process through the console scripts' targets in ``pyproject.toml``
(``[project.scripts]``), called the way an installed script calls them (no arguments, ``sys.argv``
set); two subprocesses prove the real ``python -m`` command lines.
"""
from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from distnerf import cli as C
from distnerf.schema import OptimConfig, RenderConfig, StudyConfig, ViewerConfig

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = {"distnerf-train", "distnerf-render", "distnerf-export", "distnerf-view", "distnerf-profile",
           "distnerf-study", "distnerf-scene"}


def console_scripts() -> dict[str, str]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def target(spec: str):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def call_script(script: str, args: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of the console script ``script`` run with ``args``, in-process."""
    monkeypatch.setattr(sys, "argv", [script, *args])
    try:
        code = target(console_scripts()[script])()
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    return (0 if code is None else code), out, err


def test_the_console_scripts_are_declared_and_callable():
    scripts = console_scripts()
    assert set(scripts) == SCRIPTS
    for spec in scripts.values():
        assert callable(target(spec)), spec


def _default_row(name: str, default) -> str:
    """A help row: the key, then its default as YAML writes it."""
    shown = str(default).lower() if isinstance(default, bool) else str(default)
    return rf"^\s+{re.escape(name)}\s+{re.escape(shown)}(\s|$)"


HELP = {  # what each --help must show besides its usage and examples: (text, a key's row with its schema default)
    "distnerf-train": ("model=grid", _default_row("optim.lr", OptimConfig.lr)),
    "distnerf-render": ("eval.num_views", _default_row("video_frames", RenderConfig.video_frames)),
    "distnerf-export": ("checkpoint", _default_row("out", "null")),
    "distnerf-view": ("viewer.max_resolution", _default_row("port", ViewerConfig.port)),
    "distnerf-profile": ("compare", None),
    "distnerf-study": ("--retry-failed", _default_row("cell_timeout_s", StudyConfig.cell_timeout_s)),
    "distnerf-scene": ("--kind", None),
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_help_shows_usage_keys_and_examples(script, monkeypatch, capsys):
    code, out, err = call_script(script, ["--help"], monkeypatch, capsys)
    assert code == 0, err
    assert out.startswith(f"usage: {script}") and f"\nexamples:\n  {script} " in out, out[:500]
    text, row = HELP[script]
    assert text in out
    assert row is None or re.search(row, out, re.M), (row, out)


def test_train_help_follows_the_chosen_option(monkeypatch, capsys):
    """``--help model=ngp`` lists the hash grid's keys (not the voxel grid's), with the schema's comments."""
    code, out, _ = call_script("distnerf-train", ["--help", "model=ngp"], monkeypatch, capsys)
    assert code == 0
    assert re.search(r"^\s+model\.log2_table_size\s+17\s*$", out, re.M)
    assert re.search(r"^\s+model\.num_steps\s+512\s+march steps across the scene box's diagonal$", out, re.M)
    assert "model.resolutions" not in out


@pytest.fixture(scope="module")
def bare_run(tmp_path_factory) -> Path:
    """A run directory with only a config.yaml (enough for the command line's checks)."""
    run = tmp_path_factory.mktemp("bare_run")
    (run / "config.yaml").write_text("dataset: {name: synthetic}\nmodel: {name: grid}\nstrategy: {name: ddp}\n")
    return run


WRONG = [  # (script, arguments, what the error line names)
    ("distnerf-train", ["train.bogus=1"], "'train.bogus'"),
    ("distnerf-train", ["model=bogus"], "model/bogus' (options: grid, nerf, ngp)"),
    ("distnerf-train", ["optim.lr=-1"], "optim.lr=-1.0 must be > 0"),
    ("distnerf-train", ["model=grid", "train.lr=0.01"], "train.lr moved to optim.lr"),  # the old layout, typed
    ("distnerf-render", ["run_dir={run}", "train.ckpt_every=5"], "train.ckpt_every moved to checkpoints.every"),
    ("distnerf-render", [], "missing run_dir="),
    ("distnerf-render", ["run_dir={run}", "eval.bogus=1"], "config eval.bogus"),
    ("distnerf-render", ["run_dir={run}", "video=true"], "video takes a file path"),
    ("distnerf-export", ["run_dir={run}", "out"], "argument 'out' is not key=value"),
    ("distnerf-export", ["run_dir={run}", "checkpoint={run}/nowhere"], "nowhere: no such file or directory"),
    ("distnerf-view", ["run_dir={run}", "port=abc"], "viewer.port"),
    ("distnerf-profile", ["compare", "runs/a"], "required: run_b"),
    ("distnerf-study", ["run", "conf/study/smoke.yaml"], "required: study_dir"),
    ("distnerf-scene", ["--kind", "lego", "--out", "{run}"], "invalid choice: 'lego'"),
]


@pytest.mark.parametrize("script, args, named", WRONG, ids=[f"{s}-{' '.join(a)}" for s, a, _ in WRONG])
def test_a_wrong_argument_is_one_line_exit_2(script, args, named, bare_run, monkeypatch, capsys):
    code, out, err = call_script(script, [a.format(run=bare_run) for a in args], monkeypatch, capsys)
    assert code == 2, (out, err)
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith(f"{script}") and ": error: " in err and named in err, err
    assert "Traceback" not in out + err


def test_schema_keys_read_each_fields_help():
    """A field's meaning: its ``help`` metadata (the schema helpers' ``help=``, :func:`~distnerf.schema.doc`),
    cut at its first sentence; allowed values first; a subclass restating a default keeps its base's help;
    nested sections last; no help, no meaning."""
    from dataclasses import dataclass, field
    from distnerf.schema import choice, doc, items, positive

    @dataclass
    class Inner:
        depth: int = doc(3, "how deep")

    @dataclass
    class Base:
        gamma: int = doc(1, "the base's meaning")

    @dataclass
    class Probe(Base):
        inner: Inner = field(default_factory=Inner)
        alpha: float = positive(0.5, help="spans two sentences. A second one, cut.")
        beta: str = choice("x", "y", help="beside it (e.g. x)")
        gamma: int = 2
        delta: list = items([1, 2], help="e.g. two (Eq. 3) items")
        epsilon: int = 0

    keys = C.schema_keys(Probe, "p.")
    assert keys == [C.Key("p.gamma", "2", "the base's meaning"),
                    C.Key("p.alpha", "0.5", "spans two sentences."),
                    C.Key("p.beta", "x", "one of x|y; beside it (e.g. x)"),
                    C.Key("p.delta", "[1, 2]", "e.g. two (Eq. 3) items"),
                    C.Key("p.epsilon", "0", ""),
                    C.Key("p.inner.depth", "3", "how deep")]


def test_the_real_command_lines():
    """``python -m``: the render's help, and a training override that is not a key (Hydra's path); the
    two processes side by side."""
    procs = [subprocess.Popen([sys.executable, "-m", *args], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for args in (["distnerf.render", "--help"], ["distnerf.train", "train.bogus=1"])]
    (shown, shown_err), (_, wrong_err) = (p.communicate(timeout=120) for p in procs)
    assert procs[0].returncode == 0 and shown.startswith("usage: distnerf-render run_dir=PATH"), shown_err
    assert "distnerf-render run_dir=runs/main" in shown
    assert procs[1].returncode == 2, wrong_err
    assert wrong_err.count("\n") == 1 and wrong_err.startswith("distnerf-train: error: ")
    assert "'train.bogus'" in wrong_err and "Traceback" not in wrong_err
