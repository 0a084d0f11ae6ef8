"""Where what is asked is answered (issue 46): a reader's name is compared only in
readers/, the registry that maps it to a spec; run/ asks a backend only what the `Backend`
protocol declares, never its class or an attribute it may lack. Checked on the source's
syntax tree, as test_layers.py checks imports."""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path

from test_layers import PACKAGE, ROOT

from memagent_cli import readers

TOOL = ["memagent"]


def _strings(node: ast.AST) -> Iterator[str]:
    """The string constants a comparison's operand is or holds (a tuple, list or set)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.Tuple | ast.List | ast.Set):
        for item in node.elts:
            yield from _strings(item)


def name_comparisons(root: Path, names: set[str]) -> list[str]:
    """Each comparison with one of the readers' `names` in a module outside readers/."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] == "readers":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
            elif isinstance(node, ast.Dict):  # a table keyed by a reader's name; "memagent"
                # is also the trace header's key of the tool's version, and not looked at here
                operands = [k for k in node.keys if k is not None and list(_strings(k)) != TOOL]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get":
                operands = node.args[:1]  # a lookup by a reader's name
            else:
                continue
            hits = {s for operand in operands for s in _strings(operand)} & names
            found += [f"{path.relative_to(root.parent)}:{node.lineno}: {h!r}" for h in hits]
    return found


def _mentions_backend(node: ast.AST) -> bool:
    return any(
        (isinstance(n, ast.Name) and "backend" in n.id.lower())
        or (isinstance(n, ast.Attribute) and "backend" in n.attr.lower())
        for n in ast.walk(node)
    )


def backend_probes(root: Path) -> list[str]:
    """Each isinstance of a backend class and each getattr/hasattr on a backend in run/."""
    found = []
    for path in sorted((root / "run").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            where = f"{path.relative_to(root.parent)}:{node.lineno}"
            name, args = node.func.id, node.args
            if name == "isinstance" and len(args) == 2 and _mentions_backend(args[1]):
                found.append(f"{where}: isinstance on a backend class")
            elif name in ("getattr", "hasattr") and args and _mentions_backend(args[0]):
                found.append(f"{where}: {name} on a backend")
    return found


def test_no_module_outside_readers_compares_a_reader_s_name() -> None:
    assert not name_comparisons(ROOT, set(readers.BUILT_IN))


def test_run_asks_a_backend_only_what_its_protocol_declares() -> None:
    assert not backend_probes(ROOT)


def test_each_kind_of_breach_is_found(tmp_path: Path) -> None:
    root = tmp_path / PACKAGE
    (root / "run").mkdir(parents=True)
    (root / "readers").mkdir()
    (root / "readers" / "memagent.py").write_text('READER = "memagent" == "memagent"\n')
    (root / "views.py").write_text(
        textwrap.dedent(
            """
            def label(reader, settings):
                if reader == "infmem" or reader in ("pi-mem", "x"):
                    return {"rememr1": 1}.get(settings.get("memreread"))
            """
        )
    )
    (root / "run" / "ask.py").write_text(
        textwrap.dedent(
            """
            def ask(engine):
                if isinstance(engine.backend, LlamaCppBackend):
                    return getattr(engine.backend, "calibration", None)
                return hasattr(engine.backend, "complete")
            """
        )
    )
    names = name_comparisons(root, set(readers.BUILT_IN))
    assert sorted(n.split(": ")[1] for n in names) == [
        "'infmem'",
        "'memreread'",
        "'pi-mem'",
        "'rememr1'",
    ]
    probes = backend_probes(root)
    assert sorted(p.split(": ")[1] for p in probes) == [
        "getattr on a backend",
        "hasattr on a backend",
        "isinstance on a backend class",
    ]
