"""The package's layers, bottom to top: a module imports only from its own layer and those below."""

import ast

from conftest import REPO

# registry at the ground floor; cli on top. auto.py is below modeling: the configurations register
# themselves through it, and it imports the model families only when transformers asks.
LAYERS = (
    "registry",
    "io",
    "layout",
    "config",
    "tracking",
    "data",
    "detection",
    "evaluation",
    "auto",
    "modeling",
    "tasks",
    "engine",
    "study",
    "cli",
)


def _imported_modules(path, package: list[str]) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.ImportFrom):  # relative: from its package, `level - 1` up
            base = package[: len(package) - (node.level - 1)]
            if node.module:
                names.append(".".join([*base, node.module]))
            else:
                names += [".".join([*base, alias.name]) for alias in node.names]
    return names


def test_no_import_runs_upward():
    upward = []
    for path in sorted((REPO / "vlbert").rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        package = parts[:-1]
        layer = parts[1] if len(parts) > 2 or parts[-1] != "__init__" else None
        if layer not in LAYERS:
            continue
        for name in _imported_modules(path, package):
            other = name.split(".")
            inside = other[0] == "vlbert" and len(other) > 1 and other[1] in LAYERS
            if inside and LAYERS.index(other[1]) > LAYERS.index(layer):
                upward.append(f"{path.relative_to(REPO)} imports {name}")
    assert not upward, "\n".join(upward)


def test_every_module_of_the_package_has_a_layer():
    tops = {path.relative_to(REPO / "vlbert").with_suffix("").parts[0] for path in (REPO / "vlbert").rglob("*.py")}
    # the package's own __init__, and schemas/, which holds the presets' JSON schema as package data
    assert tops - {"__init__", "schemas"} <= set(LAYERS), tops - set(LAYERS)
