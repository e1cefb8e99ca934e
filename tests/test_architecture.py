"""The import graph of the chexflow package, read from the source with `ast` (nothing imported):
no import cycle between its modules or its packages, no arrow back up into the top-level
folders a Kubeflow user edits, and the layers and rooms of ARCHITECTURE.md, read from its
diagrams, naming every package that exists and nothing that does not.

An import inside a function counts like one at module level. chexflow defers imports into
functions to keep TensorFlow and kfp out of commands that do not need them; that changes when a
module loads, not what depends on what, and a cycle made of deferred imports (as Katib's spec,
suggest and earlystop once were) is still a loop to untangle.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "chexflow"
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
# A diagram line: a rank number (or blank: another name of the rank above) at column 1, the
# name(s) at column 4, then two spaces and what it is; wrapped descriptions start further in.
DIAGRAM_LINE = re.compile(r"^ (\d| )  ([a-z_][a-z_./]*(?:, [a-z_]+)*,?)(?:\s|$)")
# The development floor: the local cluster, its images and Go builds. It sits above the engine
# (layers 0-4), which never imports it; only the benchmarks and the CLI use it.
DEV_FLOOR = "chexflow.devcluster"


def diagram(heading: str, text: str | None = None) -> dict[str, int]:
    """Each name in the first fenced diagram under `## heading` of ARCHITECTURE.md, with its
    rank (`experiment/spec` reads as experiment.spec, `commands.py` as commands)."""
    text = ARCHITECTURE.read_text() if text is None else text
    section = ("\n" + text).split(f"\n## {heading}\n", 1)[1]
    ranks: dict[str, int] = {}
    rank = -1
    for line in section.split("```", 2)[1].splitlines():
        m = DIAGRAM_LINE.match(line)
        if not m:
            continue
        rank = int(m.group(1)) if m.group(1).strip() else rank
        for name in filter(None, (n.strip() for n in m.group(2).split(","))):
            ranks[name.removesuffix(".py").strip("/").replace("/", ".")] = rank
    return ranks


def top_level_table(text: str | None = None) -> list[str]:
    """The folders of ARCHITECTURE.md's table under `## The top level` (its first column)."""
    text = ARCHITECTURE.read_text() if text is None else text
    section = text.split("\n## The top level\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`/]+)/` \|", section, re.MULTILINE)


# The layers of ARCHITECTURE.md: layer 0 is the modules directly in chexflow/ (errors, envs, ...)
# but the CLI; a package's `commands` module (its subcommands, registered by chexflow.cli) is the
# CLI's layer. A module imports only from its layer and below.
LAYER_OF = diagram("Layers")
# Katib's rooms (ARCHITECTURE.md), lowest first: a module of chexflow.katib imports only from
# its rank and below (a name is a room or a module; the longest that matches decides).
KATIB_RANK_OF = diagram("Katib's rooms")
# What a Kubeflow user edits or opens at the top level; the engine never imports these.
TOP_LEVEL = tuple(f for f in top_level_table() if f != "chexflow")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _runtime_nodes(tree: ast.AST):
    """Every node of the tree but those under `if TYPE_CHECKING:` (imports for type hints
    only, which run never and so make no cycle)."""
    for node in ast.iter_child_nodes(tree):
        test = node.test if isinstance(node, ast.If) else None
        if test is not None and "TYPE_CHECKING" in ast.unparse(test):
            for other in node.orelse:
                yield other
                yield from _runtime_nodes(other)
            continue
        yield node
        yield from _runtime_nodes(node)


def imported_names(path: Path, module: str) -> list[str]:
    """Every module the file imports, wherever the import statement is (type-checking-only
    imports aside)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            # `from pkg import sub` imports the module pkg.sub when there is one
            out += [base, *(f"{base}.{a.name}" for a in node.names)]
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: {n for n in imported_names(path, m) if n in mods and n != m}
            for m, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def test_the_cycle_finder_finds_a_cycle_and_nothing_else():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_reader_sees_imports_at_module_level_and_in_functions(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import os\ntry:\n    from chexflow import jobs\nexcept ImportError:\n"
                   "    pass\n\ndef f():\n    from chexflow.train import options\n"
                   "    from .spec import Experiment\n")
    found = set(imported_names(src, "chexflow.katib.m"))
    assert {"os", "chexflow.jobs", "chexflow.train.options", "chexflow.katib.spec"} <= found


def test_no_import_cycle_between_chexflow_modules():
    found = cycles(graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_import_cycle_between_chexflow_packages():
    edges: dict[str, set[str]] = {}
    for m, targets in graph().items():
        edges.setdefault(package_of(m), set()).update(
            package_of(t) for t in targets if package_of(t) != package_of(m))
    found = cycles(edges)
    assert not found, "packages importing each other: " + "; ".join(" <-> ".join(c)
                                                                    for c in found)


def layer(module: str) -> int:
    parts = module.split(".")
    if parts[-1] == "commands":
        return LAYER_OF["cli"]
    if len(parts) > 1 and parts[1] in LAYER_OF:
        return LAYER_OF[parts[1]]
    raise AssertionError(f"{module}: in no layer; add its package to ARCHITECTURE.md's diagram")


def test_imports_point_down_the_layers():
    up = [f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)})"
          for m, targets in graph().items() if m != "chexflow"
          for t in targets if t != "chexflow" and layer(t) > layer(m)]
    assert not up, "; ".join(up)


def test_no_chexflow_module_imports_a_top_level_folder():
    bad = [f"{path.relative_to(ROOT)} imports {name}"
           for m, path in modules().items() for name in imported_names(path, m)
           if name.split(".")[0] in TOP_LEVEL]
    assert not bad, "; ".join(bad)


def test_the_engine_never_imports_the_development_floor():
    floor = layer(DEV_FLOOR + ".x")
    bad = [f"{m} imports {t}" for m, targets in graph().items()
           if m != "chexflow" and not m.startswith(DEV_FLOOR) and layer(m) < floor
           for t in targets if t.startswith(DEV_FLOOR)]
    assert not bad, "; ".join(bad)


def katib_rank(module: str) -> int:
    rest = module.removeprefix("chexflow.katib.")
    best = max(((len(name), rank) for name, rank in KATIB_RANK_OF.items()
                if rest == name or rest.startswith(name + ".")), default=None)
    assert best is not None, f"{module}: in no room of ARCHITECTURE.md's Katib diagram"
    return best[1]


def test_katib_rooms_import_down_their_ranks():
    katib = {m: targets for m, targets in graph().items() if m.startswith("chexflow.katib.")}
    up = [f"{m} (rank {katib_rank(m)}) imports {t} (rank {katib_rank(t)})"
          for m, targets in katib.items() for t in targets
          if t.startswith("chexflow.katib.") and katib_rank(t) > katib_rank(m)]
    assert not up, "; ".join(up)


def test_the_diagram_reader_reads_ranks_names_and_lists(tmp_path):
    text = ("## Layers\n\n```\n 2  train           the worker\n                    (wrapped)\n"
            "    evaluate        AUROC\n    ------ the engine ---\n 0  envs, errors,\n"
            "    kube\n```\n\n## Rooms\n\n```\n 1  experiment/spec    the reader\n"
            " 0  commands.py        tune\n```\n")
    assert diagram("Layers", text) == {"train": 2, "evaluate": 2, "envs": 0, "errors": 0,
                                       "kube": 0}
    assert diagram("Rooms", text) == {"experiment.spec": 1, "commands": 0}


def test_architecture_names_every_package_and_module_of_layer_0_and_nothing_else():
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    named, present = set(LAYER_OF), packages | modules
    assert named == present, (
        f"in chexflow/ but not in ARCHITECTURE.md's layers: {sorted(present - named)}; "
        f"named there but not in chexflow/: {sorted(named - present)}")
    misplaced = sorted(m for m in modules if m != "cli" and LAYER_OF[m] != 0)
    assert not misplaced, f"modules directly in chexflow/ sit on layer 0: {misplaced}"


def test_architecture_names_every_room_of_katib_and_each_name_exists():
    katib = PACKAGE / "katib"
    rooms = {p.parent.name for p in katib.glob("*/__init__.py")}
    missing = sorted(rooms - set(KATIB_RANK_OF))
    assert not missing, f"Katib rooms not in ARCHITECTURE.md's Katib diagram: {missing}"
    absent = [name for name in KATIB_RANK_OF
              if not (katib / name.replace(".", "/")).is_dir()
              and not (katib / (name.replace(".", "/") + ".py")).is_file()]
    assert not absent, f"named in ARCHITECTURE.md's Katib diagram, not in chexflow/katib: {absent}"


def test_architecture_names_every_top_level_folder_and_each_one_exists():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.splitlines()
    folders = {f.split("/")[0] for f in tracked if "/" in f and not f.startswith(".")}
    named = set(top_level_table())
    assert named == folders, (
        f"top-level folders not in ARCHITECTURE.md's table: {sorted(folders - named)}; "
        f"in the table but not in the repository: {sorted(named - folders)}")


# ---- private names -----------------------------------------------------------------------------
# A name with one leading underscore is its module's own: another module (of chexflow or a
# library) uses only public names. Read from the source with `ast`:
# - `from M import _x`;
# - `obj._x` where `_x` is not defined in the module itself (a function, class, assignment,
#   attribute set or parameter of that name) and obj is not `self` or `cls` (a class may use
#   what its base classes give it): an imported module's `M._x`, another object's attribute,
#   a library's.
# Type annotations are left out: they name a type, nothing runs them (`from __future__ import
# annotations`), and argparse, for one, has no public name for its subparsers' type.
# A library's internals that have no public equivalent, each with why it is read:
LIBRARY_INTERNALS = {
    # tf-keras's legacy optimizers create their slots only inside apply_gradients or here; a
    # checkpoint restore and Horovod's broadcast need them before the first step
    "chexflow/train/recipe.py": ("optimizer._create_all_weights",),
    # optuna's GridSampler keeps its shuffled grid (which numbers each combination) only here;
    # a trial recorded without its grid id gets it from there
    "chexflow/katib/suggestions/optuna.py": ("sampler._param_names", "sampler._all_grids",
                                             "sampler._search_space"),
}


def _names_defined(tree: ast.AST) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Store):
            out.add(node.id if isinstance(node, ast.Name) else node.attr)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return out


def _annotations(tree: ast.AST) -> set[int]:
    """The ids of every node inside a type annotation."""
    roots = [n.annotation for n in ast.walk(tree)
             if isinstance(n, (ast.arg, ast.AnnAssign)) and n.annotation is not None]
    roots += [n.returns for n in ast.walk(tree)
              if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.returns]
    return {id(node) for root in roots for node in ast.walk(root)}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_reaches(source: str, where: str = "<module>") -> list[str]:
    """Where `source` uses another module's private name: `where:LINE: what`."""
    tree = ast.parse(source)
    own, hints = _names_defined(tree), _annotations(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found += [(node.lineno, f"from {node.module} import {a.name}")
                      for a in node.names if _private(a.name)]
        elif (isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own
              and id(node) not in hints
              and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            found.append((node.lineno, ast.unparse(node)))
    return [f"{where}:{line}: {what}" for line, what in sorted(found)]


def test_the_private_name_finder_finds_imports_module_and_object_reaches():
    source = ("import argparse\nimport render\nfrom certs import _signed_cert\n"
              "def f(p: argparse._SubParsersAction, sampler, other) -> None:\n"
              "    render._env(1)\n    sampler._all_grids\n    other._mine\n"
              "class C:\n    def g(self):\n        self._mine = 1\n        self._base()\n")
    assert private_reaches(source, "m.py") == [
        "m.py:3: from certs import _signed_cert", "m.py:5: render._env",
        "m.py:6: sampler._all_grids"]


def test_no_module_uses_another_modules_private_names():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(ROOT))
        allowed = LIBRARY_INTERNALS.get(where, ())
        found += [hit for hit in private_reaches(path.read_text(), where)
                  if hit.split(": ", 1)[1] not in allowed]
    assert not found, "private names used from another module (make them public where " \
                      "they are shared, or move them): " + "; ".join(found)
