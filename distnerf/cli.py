"""What every entry point does with its command line before its work: ``-h/--help`` (usage, the keys
it reads, examples; exit 0) and usage errors (one line ``distnerf-NAME: error: ...`` on stderr, exit 2,
no traceback).

Two kinds of command line:

* ``key=value`` overrides (``train``, ``render``, ``export``, ``view``): an :class:`Entry` per
  program. Its keys come from the schemas (:func:`schema_keys`: the default, the allowed values and the
  ``help`` metadata of each field in :mod:`distnerf.schema`), so the help never restates a default.
* ``argparse`` (``profile``, ``study``, the scene generator): :func:`argument_parser`, whose errors
  are one line too (argparse's own print the usage before them).

Console scripts (``pyproject.toml`` ``[project.scripts]``): ``distnerf-train``, ``distnerf-render``,
``distnerf-export``, ``distnerf-view``, ``distnerf-profile``, ``distnerf-study``, ``distnerf-scene``;
each is also ``python -m distnerf.NAME`` (the scene generator: ``python -m distnerf.data.synthetic``).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, NoReturn, Sequence

from omegaconf import MISSING

HELP_FLAGS = ("-h", "--help")
MEANING_CHARS = 150  # a key's meaning is cut at its first sentence, or here


@dataclass(frozen=True)
class Key:
    """One key of a command line: ``name`` (dotted), its ``default`` as shown, one line of meaning."""
    name: str
    default: str
    meaning: str = ""


# ----------------------------------------------------------------------------- keys from the schemas
def _one_line(text: str) -> str:
    """``text``'s first sentence, at most :data:`MEANING_CHARS` characters."""
    end = re.search(r"\.\s+(?=[A-Z])", text)  # not "e.g. x", "(Eq. 15)"
    text = text[:end.start() + 1] if end else text
    return text if len(text) <= MEANING_CHARS else text[:MEANING_CHARS - 3].rstrip() + "..."


def _comment(schema: type, name: str) -> str:
    """The one-line meaning of ``schema``'s field ``name``: its ``help`` metadata (:mod:`distnerf.schema`'s
    helpers), from the class that declares it with one (a subclass may restate the default alone)."""
    for cls in schema.__mro__:
        if not dataclasses.is_dataclass(cls) or name not in cls.__dict__.get("__annotations__", {}):
            continue
        text = next(f for f in dataclasses.fields(cls) if f.name == name).metadata.get("help", "")
        if text:
            return _one_line(text)
    return ""


def _shown(value) -> str:
    if value is MISSING:
        return "(required)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def schema_keys(schema: type, prefix: str = "", only: Sequence[str] | None = None) -> list[Key]:
    """The keys of a schema dataclass (:mod:`distnerf.schema`), nested dataclasses expanded.

    Args:
        schema: e.g. :class:`~distnerf.schema.EvalConfig`.
        prefix: prepended to each name (``"eval."``).
        only: these fields (in this order), else all of them, in declaration order; a field typed
            ``Any`` without a default (a Hydra group: ``dataset``, ...) is left out.
    Returns:
        One :class:`Key` per leaf: its default and its ``help`` (after its allowed values).
    """
    fields = {f.name: f for f in dataclasses.fields(schema)}
    names = list(only) if only is not None else list(fields)
    keys, sections = [], []  # the schema's own keys first, then its nested sections
    for name in names:
        f = fields[name]
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = f.default
        if dataclasses.is_dataclass(default):
            sections += schema_keys(type(default), f"{prefix}{name}.")
            continue
        if f.type in ("Any", "Optional[Any]") and default is MISSING:  # a config group: dataset=..., model=...
            continue
        meaning = _comment(schema, name)
        if "choices" in f.metadata:
            meaning = ("one of " + "|".join(map(str, f.metadata["choices"])) + (f"; {meaning}" if meaning else ""))
        keys.append(Key(f"{prefix}{name}", _shown(default), meaning))
    return keys + sections


def format_keys(keys: Sequence[Key], indent: int = 2) -> str:
    """Aligned rows ``name  default  meaning``."""
    if not keys:
        return ""
    width = min(max(len(k.name) for k in keys), 36)
    dwidth = min(max(len(k.default) for k in keys), 24)
    return "\n".join(f"{' ' * indent}{k.name:<{width}}  {k.default:<{dwidth}}  {k.meaning}".rstrip() for k in keys)


# ----------------------------------------------------------------------------- key=value entry points
@dataclass
class Entry:
    """A ``key=value`` entry point: its help and its usage errors.

    Args:
        name: the program, ``distnerf-NAME`` (console script) or ``python -m distnerf.NAME``.
        summary: one line, what it does.
        usage: the arguments after the program's name, e.g. ``run_dir=PATH [key=value ...]``.
        keys: the keys it reads (a callable gets the command line: the keys can follow ``dataset=...``).
        examples: command lines after the program's name.
        notes: text after the keys (what else can be overridden, where the meanings are).
        required: keys that must be given (a missing one is a usage error naming it).
        existing: keys naming a file or folder, when given, that must exist.
        module: ``python -m`` module; default ``distnerf.NAME``.
    """
    name: str
    summary: str
    usage: str
    keys: Sequence[Key] | Callable[[Sequence[str]], str]
    examples: Sequence[str]
    notes: str = ""
    required: Sequence[tuple[str, str]] = ()  # (key, what it is)
    existing: Sequence[str] = ()
    module: str | None = None

    @property
    def prog(self) -> str:
        return f"distnerf-{self.name}"

    def help(self, argv: Sequence[str] = ()) -> str:
        keys = self.keys(argv) if callable(self.keys) else format_keys(self.keys)
        module = self.module or f"distnerf.{self.name}"
        parts = [f"usage: {self.prog} {self.usage}\n       python -m {module} {self.usage}", "", self.summary, "",
                 "keys (key=value; default; meaning):", keys]
        if self.notes:
            parts += ["", self.notes]
        parts += ["", "examples:", *(f"  {self.prog} {e}" for e in self.examples)]
        return "\n".join(parts) + "\n"

    def error(self, message, status: int = 2) -> NoReturn:
        """One line on stderr, ``PROG: error: MESSAGE``, then exit ``status`` (2: a usage error)."""
        text = " ".join(str(message).split()) or type(message).__name__
        print(f"{self.prog}: error: {text}", file=sys.stderr)
        raise SystemExit(status)

    def answer_help(self, argv: Sequence[str]) -> list[str]:
        """``argv``; with ``-h`` or ``--help`` in it, the help on stdout and exit 0."""
        if any(a in HELP_FLAGS for a in argv):
            sys.stdout.write(self.help(argv))
            raise SystemExit(0)
        return list(argv)

    def parse(self, argv: Sequence[str]) -> list[str]:
        """The ``key=value`` items of ``argv``; ``-h/--help`` prints the help and exits 0.

        Exits 2 (one line) on an item that is not ``key=value`` and on a missing required key.
        """
        argv = self.answer_help(argv)
        for arg in argv:
            key = arg.split("=", 1)[0]
            if "=" not in arg or arg.startswith("-") or not key:
                self.error(f"argument {arg!r} is not key=value (usage: {self.prog} {self.usage}; "
                           f"{self.prog} --help lists the keys)")
        given = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in argv}
        for key, what in self.required:
            if not given.get(key):
                self.error(f"missing {key}=... ({what}; usage: {self.prog} {self.usage})")
        for key in self.existing:
            if given.get(key) and not Path(given[key]).exists():
                self.error(f"{key}={given[key]}: no such file or directory")
        return argv

    def run(self, main, argv: Sequence[str] | None, failures: tuple[type[BaseException], ...], *usage) -> int:
        """``main(argv)`` as a console script runs it: a usage error (``usage``, as :meth:`usage_errors`) is
        one line, exit 2; one of ``failures`` (e.g. a missing or damaged checkpoint) one line, exit 1;
        else 0 (whatever ``main`` returns)."""
        try:
            with self.usage_errors(*usage):
                main(argv)
        except failures as err:
            self.error(err, status=1)
        return 0

    @contextlib.contextmanager
    def usage_errors(self, *errors: type[BaseException]) -> Iterator[None]:
        """Inside: ``errors`` (default ``ValueError`` (``ConfigError`` is one) and ``FileNotFoundError``)
        end the program with one line naming them, exit 2."""
        try:
            yield
        except errors or (ValueError, FileNotFoundError) as err:
            self.error(err)


# ----------------------------------------------------------------------------- argparse entry points
class _OneLineErrors(argparse.ArgumentParser):
    """argparse whose usage errors are one line (``PROG: error: MESSAGE (see PROG --help)``), exit 2;
    its sub-command parsers are of the same class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def argument_parser(name: str, summary: str, examples: Sequence[str], module: str | None = None,
                    keys: str = "") -> argparse.ArgumentParser:
    """An ``argparse`` parser for ``distnerf-NAME``: its help ends with ``keys`` (e.g.
    :func:`format_keys` of a config file's schema) and the examples; its errors are one line, exit 2.

    Args:
        examples: command lines after the program's name.
        module: ``python -m`` module; default ``distnerf.NAME``.
    """
    prog = f"distnerf-{name}"
    epilog = (keys + "\n\n" if keys else "") + "examples:\n" + "\n".join(f"  {prog} {e}" for e in examples)
    return _OneLineErrors(prog=prog, description=f"{summary} (also: python -m {module or 'distnerf.' + name})",
                          epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)


def argparse_keys(title: str, keys: Sequence[Key]) -> str:
    """A titled block of keys for :func:`argument_parser`'s ``keys``."""
    return f"{title}\n{format_keys(keys)}"



# ----------------------------------------------------------------------------- Hydra entry points
def config_groups(conf_dir: Path, config_name: str, chosen: dict[str, str]) -> list[Key]:
    """The groups a user picks in ``CONF/CONFIG_NAME.yaml``'s defaults list (not the ones it selects
    itself, ``a@b``), each with its default (or the option in ``chosen``) and its options."""
    from omegaconf import OmegaConf

    rows = []
    for item in OmegaConf.to_container(OmegaConf.load(conf_dir / f"{config_name}.yaml")).get("defaults", []):
        if not isinstance(item, dict):
            continue
        (key, default), = item.items()
        group = key.removeprefix("optional ").strip()
        if "@" in group or " " in group or not (conf_dir / group).is_dir():
            continue
        options = sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))
        rows.append(Key(f"{group}={chosen.get(group, default) or ''}", "", "options: " + ", ".join(options)))
    return rows


def _hydra_message(err: BaseException) -> str:
    """One line of a Hydra or OmegaConf composition error: its first line, the first line of its
    cause, the group's options of a missing one."""
    lines = str(err).splitlines() or [type(err).__name__]
    text = lines[0].rstrip(".")
    if type(err).__name__ == "OverrideParseException" and len(lines) > 1:
        text += f": {lines[1]}"
    cause = err.__cause__
    if cause is not None and str(cause).strip():
        text += f": {str(cause).splitlines()[0]}"
    options = [o for o in getattr(err, "options", None) or [] if not o.startswith("schema")]
    if options:
        text += f" (options: {', '.join(options)})"
    return text


def check_overrides(entry: Entry, argv: Sequence[str], conf_dir: Path, config_name: str,
                    validate: Callable) -> None:
    """Compose ``config_name`` with the overrides ``argv`` (Hydra's compose API) and ``validate``
    it: an unknown key or option, a wrong type or a value out of range is one usage-error line, exit 2.
    Returns when the overrides compose and validate, or when ``argv`` has Hydra's flags
    (``--cfg``, ``--multirun``, ``-cn``, ...: Hydra's own errors stand).
    """
    if any(a.startswith("-") for a in argv):
        return
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if GlobalHydra.instance().is_initialized():  # inside another Hydra app: its composition reports
        return
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = compose(config_name, overrides=list(argv))
        validate(cfg)
    except (HydraException, OmegaConfBaseException, ValueError) as err:
        entry.error(f"{_hydra_message(err)} ({entry.prog} --help lists the keys)")


class HydraCommandLine:
    """A ``@hydra.main`` entry point whose composition errors are one line, exit 2, at no cost when
    the config composes: Hydra's stderr is held until the task function calls :meth:`started`; if
    Hydra exits before that (it printed a multi-line error, exit 1), the overrides are composed again
    by :func:`check_overrides` for the one line. Anything else Hydra wrote is passed on.

    Args:
        entry: the program's :class:`Entry` (its help and its error line).
        conf_dir, config_name: what the task function's ``@hydra.main`` composes.
        validate: the check the task function runs first (schemas, bounds), raising ``ValueError``.
    """

    def __init__(self, entry: Entry, conf_dir: Path, config_name: str, validate: Callable):
        self.entry, self.conf_dir, self.config_name, self.validate = entry, conf_dir, config_name, validate
        self._held: tuple | None = None  # (the real stderr, the buffer) while held

    def run(self, hydra_main: Callable[[], None], argv: Sequence[str]) -> None:
        """``--help``, then ``hydra_main()`` on ``argv`` (it reads ``sys.argv``)."""
        argv = self.entry.answer_help(argv)
        from .config_check import ConfigError, refuse_moved_keys

        try:  # an old train.* key (the sections by concern): one line naming the new key
            refuse_moved_keys([a for a in argv if not a.startswith("-")])
        except ConfigError as err:
            self.entry.error(str(err))
        sys.argv = [sys.argv[0], *argv]
        self._held = (sys.stderr, io.StringIO())
        sys.stderr = self._held[1]
        try:
            hydra_main()
        except SystemExit as stop:
            if self._held is not None and stop.code not in (0, None):  # before the task function
                said = self._release()
                check_overrides(self.entry, argv, self.conf_dir, self.config_name, self.validate)  # exits 2
                sys.stderr.write(said)  # not an override's error: Hydra's own message
            raise
        finally:
            self.started()

    def started(self) -> None:
        """Called first by the task function (the config composed): what Hydra held goes out."""
        sys.stderr.write(self._release())

    def _release(self) -> str:
        """Stop holding; what was held."""
        if self._held is None:
            return ""
        real, buffer = self._held
        self._held = None
        sys.stderr = real
        return buffer.getvalue()
