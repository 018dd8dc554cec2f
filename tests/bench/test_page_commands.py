"""Every training command on a page (README.md, docs/*.md, bench/**/*.md) composes: its overrides,
the ones after ``-m distnerf.train`` (``python -m`` or ``torchrun ... -m``), parsed by Hydra and validated
against the schemas, with no training. A renamed or moved key on a page (``train.lr`` after the sections by
concern) fails here, naming the page and the command."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from distnerf import config_check

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
         *sorted(p for p in (ROOT / "bench").glob("**/*.md") if "results" not in p.parts)]
SHELL_ENDS = {"&&", "||", ";", "|", ">", ">>", "2>&1", "&"}


def page_commands(text: str) -> list[str]:
    """The argument text after each ``-m distnerf.train`` of ``text``: continuation lines joined, an inline
    code span cut at its closing backtick."""
    text = re.sub(r"\\\n\s*", " ", text)
    found = []
    for line in text.splitlines():
        for m in re.finditer(r"-m distnerf\.train(?=[\s`]|$)", line):
            rest = line[m.end():]
            if line[:m.start()].count("`") % 2:  # inside an inline code span
                rest = rest.split("`", 1)[0]
            found.append(rest)
    return found


def overrides(command: str) -> list[str]:
    """The ``key=value`` overrides of one command's arguments, up to the end of the shell command or a
    comment; Hydra's own flags (``--cfg job``) and placeholders in brackets (``[viewer.port=7007]``) left out."""
    out, words = [], shlex.split(command, comments=True)
    for i, word in enumerate(words):
        if word in SHELL_ENDS or word.startswith(">"):
            break
        if "=" in word and not word.startswith(("-", "[")) and not words[i - 1:i] == ["--cfg"]:
            out.append(word)
    return out


def test_page_commands_are_found_and_parsed():
    text = ("```bash\npython -m distnerf.train model=ngp train.max_steps=2000 \\\n    run_dir=runs/ngp  # a note\n"
            "torchrun --nproc_per_node=2 -m distnerf.train strategy=ss 'model.resolutions=[8,16]' && python -m "
            "distnerf.render run_dir=x\n```\nInline: `python -m distnerf.train optim.lr=0.01` and more=1.\n"
            "`python -m distnerf.train --cfg job [overrides]`\n")
    assert [overrides(c) for c in page_commands(text)] == [
        ["model=ngp", "train.max_steps=2000", "run_dir=runs/ngp"], ["strategy=ss", "model.resolutions=[8,16]"],
        ["optim.lr=0.01"], []]


COMMANDS = {page.relative_to(ROOT).as_posix(): list(dict.fromkeys(  # each page's distinct override lists
    tuple(overrides(command)) for command in page_commands(page.read_text()) if overrides(command))) for page in PAGES}


def test_the_pages_hold_training_commands():
    assert sum(map(len, COMMANDS.values())) >= 50
    assert all(COMMANDS[page] for page in ("README.md", "docs/training.md", "bench/scaling/large_scenes.md"))


@pytest.mark.parametrize("page", [page for page, commands in COMMANDS.items() if commands])
def test_every_training_command_of_a_page_composes_and_validates(page):
    """Composed by Hydra and validated; a required key a command leaves to its prose (``dataset.root``) aside."""
    failed = []
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for items in COMMANDS[page]:
            try:
                config_check.refuse_moved_keys(items)  # an old train.* key: the error names its new key
                config_check.validate(compose("train", overrides=list(items)))
            except Exception as err:  # noqa: BLE001 - Hydra's, OmegaConf's and the schemas' errors alike
                if not re.search(r"config \S+ is required", str(err)):
                    failed.append(f"{' '.join(items)}\n    -> {str(err).splitlines()[0]}")
    assert not failed, f"{page}:\n" + "\n".join(failed)
