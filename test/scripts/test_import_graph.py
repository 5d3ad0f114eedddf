"""Proves that the Python model package (scripts/model/) and the scripts beside it (scripts/*.py:
the GR00T checkpoint converter and exporter, their shared name table, the upstream config reader,
...) import each other without a cycle, and that the model package is layered: the shared layers
import no model family, the families import neither each other's builder nor the registry, and
the two checkpoint scripts share gr00t_checkpoint_names instead of importing each other.

The graph is read from the source with `ast`, not by importing it, and it counts every import
statement wherever it stands: one inside a function (the usual way to dodge a cycle) is an edge
like any other. Nodes are the names the modules have with scripts/ on sys.path (`model`,
`model.n16`, `convert_gr00t_checkpoint`, ...); `from package import name` is an edge to the
submodule when `name` is one (Python imports it then), else to the package's __init__.
The first test runs the same reader on a small tree with a function-level cycle, so a cycle
brought back into the real tree is seen (and printed) the same way."""
import ast
from pathlib import Path
from typing import Dict, List, Optional, Set

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
PACKAGE = "model"


def module_names(scripts: Path) -> Dict[str, Path]:
    """{module name: file} of scripts/*.py and scripts/model/*.py (the package's __init__ as `model`)."""
    out = {p.stem: p for p in sorted(scripts.glob("*.py"))}
    for p in sorted((scripts / PACKAGE).glob("*.py")):
        out[PACKAGE if p.stem == "__init__" else f"{PACKAGE}.{p.stem}"] = p
    return out


def imported(importer: str, path: Path, node: ast.AST, known: Set[str]) -> List[str]:
    """The known modules one import statement of module `importer` (file `path`) loads."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        package = importer.split(".") if path.name == "__init__.py" else importer.split(".")[:-1]
        base = ".".join(package[:len(package) - (node.level - 1)] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    out = []
    for a in node.names:
        sub = f"{base}.{a.name}"
        if sub in known:
            out.append(sub)
        elif base in known:
            out.append(base)
    return out


def import_graph(scripts: Path) -> Dict[str, Set[str]]:
    """{module: the known modules it imports anywhere in its file (module level or in a function)}."""
    files = module_names(scripts)
    known = set(files)
    graph: Dict[str, Set[str]] = {}
    for name, path in files.items():
        edges: Set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(imported(name, path, node, known))
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One import cycle as [a, b, ..., a], or None when the graph is acyclic."""
    state: Dict[str, int] = {}   # 1 = on the current path, 2 = done
    path: List[str] = []

    def visit(n: str) -> Optional[List[str]]:
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_reader_finds_a_cycle_made_by_an_import_inside_a_function(tmp_path):
    (tmp_path / PACKAGE).mkdir()
    (tmp_path / PACKAGE / "__init__.py").write_text("from .family import Model\n")
    (tmp_path / PACKAGE / "layers.py").write_text("import torch\n")
    (tmp_path / PACKAGE / "family.py").write_text("from .layers import *\n\ndef build():\n"
                                                  "    from .registry import build_model\n")
    (tmp_path / PACKAGE / "registry.py").write_text("from . import family\n")
    (tmp_path / "convert.py").write_text("def main():\n    from model.registry import build_model\n")
    graph = import_graph(tmp_path)
    assert graph == {"convert": {"model.registry"}, "model": {"model.family"}, "model.layers": set(),
                     "model.family": {"model.layers", "model.registry"}, "model.registry": {"model.family"}}
    cycle = find_cycle(graph)
    assert cycle == ["model.registry", "model.family", "model.registry"]   # met from convert, first in order
    (tmp_path / PACKAGE / "family.py").write_text("from .layers import *\n")
    assert find_cycle(import_graph(tmp_path)) is None


def test_scripts_and_the_model_package_import_without_a_cycle():
    graph = import_graph(SCRIPTS)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
    assert {"model", "model.layers", "model.n16", "model.gr00t", "model.registry", "convert_gr00t_checkpoint",
            "export_gr00t_checkpoint", "gr00t_upstream_config", "gr00t_checkpoint_names"} <= set(graph)


def test_the_model_package_imports_only_downward():
    graph = import_graph(SCRIPTS)
    families = {"model.n16", "model.backbones", "model.gr00t"}
    # the shared layers import no family nor the registry; no family imports the registry or the package's
    # __init__ (which imports the registry); gr00t and backbones build on layers, not on n16; the registry
    # picks between n16 and gr00t; flops and export take the policies from the registry
    assert not graph["model.layers"] & (families | {"model.registry"})
    for family in families:
        assert "model.registry" not in graph[family], family
        assert PACKAGE not in graph[family], family   # the package's __init__ imports the families
    assert "model.n16" not in graph["model.gr00t"] and "model.n16" not in graph["model.backbones"]
    assert {"model.n16", "model.gr00t"} <= graph["model.registry"]
    assert "model.registry" in graph["model.flops"] and "model.registry" in graph["model.export"]


def test_the_checkpoint_scripts_share_the_name_table_instead_of_importing_each_other():
    graph = import_graph(SCRIPTS)
    convert, export, upstream = "convert_gr00t_checkpoint", "export_gr00t_checkpoint", "gr00t_upstream_config"
    assert convert not in graph[export] and export not in graph[convert]
    assert convert not in graph[upstream]
    for script in (convert, export, upstream):
        assert "gr00t_checkpoint_names" in graph[script], script
    assert graph["gr00t_checkpoint_names"] == set()
