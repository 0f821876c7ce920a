"""The package layers, enforced: each module imports only from its own layer or below, and no modules import
each other in a cycle (function-level imports included; only `if TYPE_CHECKING:` blocks are exempt).

    errors, io, paths, progress  ->  vocab  ->  models  ->  decode  ->  {bench, tune, train, vllm_plugin}  ->  commands  ->  cli
    (frspec/__init__.py and __main__.py sit on top)
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "frspec"

LAYERS = [
    {"errors", "io", "paths", "progress"},
    {"vocab"},
    {"models"},
    {"decode"},
    # tune confirms its pick with the bench's runner; the bench measures cost curves with tune's cost model.
    {"bench", "tune", "train", "vllm_plugin"},
    {"commands"},
    {"cli"},
    {"__init__", "__main__"},
]
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _component(module: str) -> str:
    """The layer component of a frspec module: frspec.decode.step -> decode, frspec (the package) -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, module: str, known: set[str]) -> list[tuple[str, int]]:
    """(imported frspec module, line) for every import in `path`, resolved to a module of the package."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "frspec" or alias.name.startswith("frspec."):
                    found.append((alias.name, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "frspec" or target.startswith("frspec."):
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    found.append((sub if sub in known else target, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _graph() -> tuple[dict[str, Path], dict[str, list[tuple[str, int]]]]:
    paths = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    known = set(paths)
    edges = {m: [(t, line) for t, line in _imports(p, m, known) if t != m] for m, p in paths.items()}
    return paths, edges


def test_every_component_has_a_layer():
    paths, _ = _graph()
    unknown = sorted({_component(m) for m in paths} - set(LAYER_OF))
    assert not unknown, f"modules outside the layer list (add them to LAYERS in {__file__}): {unknown}"


def test_no_module_imports_from_a_higher_layer():
    paths, edges = _graph()
    bad = []
    for module, imported in edges.items():
        mine = LAYER_OF.get(_component(module))
        for target, line in imported:
            theirs = LAYER_OF.get(_component(target))
            if mine is not None and theirs is not None and theirs > mine:
                rel = paths[module].relative_to(SRC.parent)
                bad.append(f"{rel}:{line}: {module} ({_component(module)}) imports {target} ({_component(target)})")
    assert not bad, "upward imports:\n" + "\n".join(dict.fromkeys(bad))


def test_no_import_cycles():
    paths, edges = _graph()
    # Importing frspec.a.b also runs frspec.a's __init__; package __init__ files are counted as their own modules.
    graph = {m: sorted({t for t, _ in edges[m] if t in paths}) for m in paths}
    line_of = {(m, t): line for m in edges for t, line in edges[m]}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def dfs(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                dfs(nxt)
        stack.pop()
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            dfs(m)
    described = []
    for cycle in cycles:
        hops = [f"{paths[a].relative_to(SRC.parent)}:{line_of[(a, b)]} imports {b}" for a, b in zip(cycle, cycle[1:])]
        described.append("  " + "\n  ".join(hops))
    assert not cycles, "import cycles:\n" + "\n\n".join(described)
