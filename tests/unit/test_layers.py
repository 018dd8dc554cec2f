"""The package's import graph against the floors declared in README.md (Layout): no module
imports from a floor above its own, including imports inside functions."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "distnerf"


def declared_floors() -> dict[str, int]:
    text = (ROOT / "README.md").read_text()
    block = text[text.index("<!-- layers -->"):text.index("<!-- /layers -->")]
    floors = {}
    for line in block.splitlines():
        m = re.match(r"\s*(\d+)\.\s+(.*)", line)
        if m:
            for name in re.findall(r"`([a-z_]+)`", m.group(2)):
                floors[name] = int(m.group(1))
    return floors


def unit_of(module: str) -> str:
    """``distnerf.strategy.ss`` -> ``strategy``; ``distnerf.train`` -> ``train``."""
    return module.split(".")[1]


def imports_of(path: Path) -> list[tuple[int, str]]:
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    package = package.removesuffix(".__init__")
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("distnerf.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "distnerf":  # `from .. import dist` / `from distnerf import checkpoint`
                found += [(node.lineno, f"distnerf.{a.name}") for a in node.names]
            elif target.startswith("distnerf."):
                found.append((node.lineno, target))
    return found


def test_every_unit_has_a_floor():
    floors = declared_floors()
    units = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" and p.name != "__init__.py") or (p.is_dir() and (p / "__init__.py").exists())}
    assert units - {"__main__"} <= set(floors), f"no floor declared in README.md for {units - set(floors)}"


def test_no_import_from_a_higher_floor():
    floors = declared_floors()
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if len(rel.parts) == 2 and path.name == "__init__.py":
            continue
        own = floors[unit_of(".".join(rel.with_suffix("").parts))]
        for line, target in imports_of(path):
            if floors[unit_of(target)] > own:
                violations.append(f"{rel}:{line} imports {target} (floor {floors[unit_of(target)]} > {own})")
    assert not violations, "\n".join(violations)


def test_the_check_sees_relative_and_function_level_imports(tmp_path):
    """The walker resolves ``from ..x import y`` and imports inside functions (so the
    test above can fail)."""
    probe = PACKAGE / "model" / "grid.py"
    targets = {t for _, t in imports_of(probe)}
    assert "distnerf.renderer.occupancy" in targets and "distnerf.schema" in targets
    ss = {t for _, t in imports_of(PACKAGE / "strategy" / "base.py")}
    assert "distnerf.model" in ss  # a function-level import in Strategy.build_model
