"""The package's layers, bottom to top: a module imports only from its own layer and those below."""

import ast
import re

from conftest import REPO

from vlbert.registry import FAMILIES

# registry at the ground floor; cli on top.
LAYERS = (
    "registry",
    "hardware",
    "io",
    "layout",
    "config",
    "tracking",
    "data",
    "detection",
    "evaluation",
    "modeling",
    "tasks",
    "engine",
    "study",
    "cli",
)


def _imports(path, package: list[str]) -> list[tuple[str, list[str]]]:
    """Each module the file imports (absolute), with the names it takes from it ([] for `import m`)."""
    imports = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imports += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imports.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.ImportFrom):  # relative: from its package, `level - 1` up
            base = package[: len(package) - (node.level - 1)]
            if node.module:
                imports.append((".".join([*base, node.module]), [alias.name for alias in node.names]))
            else:
                imports += [(".".join([*base, alias.name]), []) for alias in node.names]
    return imports


def _imported_modules(path, package: list[str]) -> list[str]:
    return [module for module, _ in _imports(path, package)]


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


def test_no_model_family_reaches_into_another_s_modules():
    """What the families share lives in modules of its own (pretrained.py: init, loading and
    checkpoints; inputs.py: VisualInputs; heads.py: heads and losses): a family's modeling file
    imports no other family's modeling module, and a family's files take only public names from
    another family's configuration module (every config subclasses StudyConfig)."""
    modeling = REPO / "vlbert" / "modeling"
    crossings = []
    for family in FAMILIES.values():
        others = [f for f in FAMILIES.values() if f.name != family.name]
        other_modeling = {f"vlbert.modeling.{f.modeling_module}" for f in others}
        other_configuration = {f"vlbert.modeling.{f.configuration_module}" for f in others}
        for module in (family.modeling_module, family.configuration_module):
            path = modeling / f"{module}.py"
            assert path.exists(), path
            for imported, names in _imports(path, ["vlbert", "modeling"]):
                private = [name for name in names if name.startswith("_")]
                if module == family.modeling_module and imported in other_modeling:
                    crossings.append(f"{path.relative_to(REPO)} imports {imported} {names}")
                elif imported in other_modeling | other_configuration and (private or not names):
                    crossings.append(f"{path.relative_to(REPO)} imports {imported} {private or '(the module)'}")
    assert not crossings, "\n".join(crossings)


def _module_name(path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Each module of the package and the package's modules it imports. `from p import m` is an
    import of p.m where p.m is a module, else of p; a module's packages are not counted (Python
    imports them first, but they are not what the module depends on)."""
    paths = {_module_name(path): path for path in sorted((REPO / "vlbert").rglob("*.py"))}
    graph = {}
    for name, path in paths.items():
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        edges = set()
        for module, names in _imports(path, parts[:-1]):
            targets = [f"{module}.{n}" for n in names if f"{module}.{n}" in paths]
            if not targets or len(targets) < len(names):
                targets.append(module)
            for target in targets:
                while target and target not in paths:  # a name from a module: the module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def test_no_import_circle():
    """No module of the package imports itself through others: neither at module level nor by an
    import deferred into a function (a deferred import that dodges a circle is still one: the two
    modules cannot be understood, or moved, apart)."""
    graph = _import_graph()
    circles, done, path = [], set(), []

    def visit(module):
        if module in path:
            circles.append(" -> ".join([*path[path.index(module) :], module]))
            return
        if module in done:
            return
        path.append(module)
        for other in sorted(graph[module]):
            visit(other)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
    assert not circles, "\n".join(circles)


def test_the_engine_talks_to_neither_mlflow_nor_ray():
    """The loop, its callbacks and the stages record through a tracker (tracking.py holds MLflow)
    and are reported to Ray by the sweep's callback (study/sweep.py)."""
    talking = []
    for path in sorted((REPO / "vlbert" / "engine").rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        for name in _imported_modules(path, parts[:-1]):
            if name.split(".")[0] in ("mlflow", "ray"):
                talking.append(f"{path.relative_to(REPO)} imports {name}")
    assert not talking, "\n".join(talking)


def test_the_engine_tells_no_model_family_by_name():
    """What differs between the families reaches the engine from their classes and registry entries
    (a pre-trained CNN's rate factor, a single-stream encoder's attention columns, a setting's model
    overrides), never from a family's name: VL-BERT's no more than the others' (what serves every
    family, the config base and the processor, is the study's)."""
    titles = {family.title.lower() for family in FAMILIES.values()}  # "vl-bert", "vilbert", ...
    # Class prefixes ("VLBert"), as written; a family's name in quotes (the package is `vlbert`).
    names = {family.model_class.removesuffix("Model") for family in FAMILIES.values()}
    names |= {f"{quote}{family.name}{quote}" for family in FAMILIES.values() for quote in "\"'"}
    named = []
    for path in sorted((REPO / "vlbert" / "engine").glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if (
                any(title in line.lower() for title in titles)
                or any(name in line for name in names)
                or re.search(r"\bfamily\s*[!=]=", line)
            ):
                named.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not named, "\n".join(named)
