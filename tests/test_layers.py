"""The package's layers point down, as docs/design.md draws them.

Invariants pinned:
- every import of a ``groupwise`` module, at module level or inside a function (a deferred import is still a
  dependency), names a package in the importer's own layer or below it; imports under ``TYPE_CHECKING`` are
  annotations only and are not counted;
- the leaf modules (the shared value types and small helpers that import nothing above them) may be imported
  from anywhere, and they import only other leaves;
- every package and top-level module of ``src/groupwise`` has a layer: a new one must be placed in the drawing.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "groupwise"
LEAVES = {
    "types", "batch", "rows", "plugins", "seeding", "abandoned", "optional_packages", "digests", "episodes.record",
}
LAYERS = [  # bottom first; the same order as docs/design.md, "Layers point down"
    {"algo"},
    {"config"},
    {"chunks", "model", "data"},
    {"generation"},
    {"episodes"},
    {"environments", "run", "harness", "sandbox"},
    {"controller"},
    {"trainer"},
    {"runtime", "sim"},
    {"cli"},
]
LAYER = {name: index for index, names in enumerate(LAYERS) for name in names}


def unit_of(module: str) -> str:
    """``groupwise.a.b`` -> ``a`` (or the leaf ``a.b`` where that module is a leaf)."""
    parts = module.split(".")[1:]
    return ".".join(parts[:2]) if ".".join(parts[:2]) in LEAVES else (parts[0] if parts else "")


def runtime_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every ``groupwise`` import outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    guarded = [n for n in ast.walk(tree) if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)]
    skipped = {id(n) for node in guarded for child in node.body for n in ast.walk(child)}
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, module) for line, module in found if module.startswith("groupwise.")]


def test_every_import_points_down_the_layers():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).with_suffix("")
        importer = unit_of("groupwise." + ".".join(relative.parts))
        if importer in ("__init__", "__main__"):
            continue
        for line, module in runtime_imports(path):
            target = unit_of(module)
            if target == importer or target in LEAVES and importer not in LEAVES:
                continue
            if importer in LEAVES:
                ok = target in LEAVES
            else:
                ok = target in LEAVES or LAYER[target] <= LAYER[importer]
            if not ok:
                wrong.append(f"{relative}.py:{line} ({importer}) imports {module} ({target})")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_every_package_has_a_layer():
    units = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    units |= {p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    assert units - set(LAYER) - LEAVES == set()
