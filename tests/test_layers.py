"""The layering contract of memagent_cli, checked on every `make test`.

    cli -> views -> run, evaluation, api -> trace, documents, models, backends -> core

A module may import its own layer or the layers below it, never above; the four packages
of the parts layer never import each other (a backend finds no models, a trace reads no
documents); nothing imports in a cycle; and no module imports its own package's
`__init__` (re-exports are for the packages' users, not their parts). Imports inside
functions count like any other, so a lazy import cannot hide an upward edge or a cycle.

The code map of docs/development.md says the same: every module is named in its package's
row, and the row's layer is the module's, so the map cannot drift from the tree.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "memagent_cli"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
CODE_MAP_PAGE = ROOT.parent / "docs" / "development.md"

# Highest first. A module belongs to the first entry that is it or a package above it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("cli", ("cli", "__main__")),
    ("views", ("views",)),
    ("run", ("run", "evaluation", "api")),
    ("parts", ("trace", "documents", "models", "backends")),
    (
        "core",
        (
            "reader",
            "scheduler",
            "readers",
            "provenance",
            "protocol",
            "chunking",
            "backend",
            "progress",
            "errors",
            "crash",
            "files",
            "cpus",
            "gguf_header",
            "folders",
            "text",
            "",
        ),
    ),
]
INDEPENDENT = ("parts",)  # layers whose packages do not import one another
# Views that say what a trace holds in plain strings, for the terminal, Markdown and HTML
# alike: they import no Rich themselves (views/traces/__init__.py).
PURE_VIEWS = ("views/traces/diffs.py", "views/traces/wording.py")


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of the package under `root`, by dotted name."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = (package, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported module, line) for each import of a module of the package in `path`,
    wherever it stands. `from P import m` imports the module P.m when there is one."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            if base not in known:
                continue
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                yield (submodule if submodule in known else base), node.lineno


def layer_of(name: str, package: str) -> tuple[int, str]:
    """(rank from the top, the layer's package) that `name` belongs to."""
    relative = name.removeprefix(package).removeprefix(".")
    for rank, (_, members) in enumerate(LAYERS):
        for member in members:
            if member and (relative == member or relative.startswith(member + ".")):
                return rank, member
    for rank, (_, members) in enumerate(LAYERS):
        if "" in members and "." not in relative and relative in members + ("",):
            return rank, ""
    raise LookupError(name)


def violations(root: Path, package: str) -> list[str]:
    """Every breach of the contract in the package under `root`, one sentence each."""
    known = modules(root, package)
    problems: list[str] = []
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        try:
            rank, member = layer_of(name, package)
        except LookupError:
            problems.append(f"{name} is in no layer: add it to LAYERS in tests/test_layers.py")
            continue
        own_package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for target, line in imports(name, path, known):
            if target == name:
                continue
            graph[name].add(target)
            where = f"{path.relative_to(root.parent)}:{line}"
            inside = own_package == target or own_package.startswith(target + ".")
            if target != package and inside and known[target].name == "__init__.py":
                problems.append(f"{where}: {name} imports its own package {target}")
                continue
            try:
                target_rank, target_member = layer_of(target, package)
            except LookupError:
                continue
            if target_rank < rank:
                problems.append(
                    f"{where}: {name} ({LAYERS[rank][0]}) imports {target} "
                    f"({LAYERS[target_rank][0]}), a layer above it"
                )
            elif target_rank == rank and LAYERS[rank][0] in INDEPENDENT and target_member != member:
                problems.append(
                    f"{where}: {name} imports {target}; the {LAYERS[rank][0]} layer's "
                    "packages are independent"
                )
    problems += [f"import cycle: {' -> '.join(cycle)}" for cycle in cycles(graph)]
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(_path_through(sorted(group), graph))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _path_through(group: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A cycle inside `group`, from its first member back to it."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph[node] & members):
            if nxt == start:
                return paths[node] + [start]
            if nxt not in paths:
                paths[nxt] = paths[node] + [nxt]
                queue.append(nxt)
    return group


CODE_MAP_HEADER = "| layer | module | what it owns |"


def code_map(page: str) -> list[tuple[str, set[str], set[str]]]:
    """(layer, the names in backticks of the module cell, those of the whole row) for each
    row of the code map table in `page`."""
    lines = page.splitlines()
    start = lines.index(CODE_MAP_HEADER) + 2  # past the header and its |---| line
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        layer, module, _ = (cell.strip() for cell in line.strip("|").split("|", 2))
        rows.append(
            (layer, set(re.findall(r"`([^`]+)`", module)), set(re.findall(r"`([^`]+)`", line)))
        )
    return rows


def unmapped(root: Path, package: str, page: str) -> list[str]:
    """Every module the code map in `page` does not name, or names in another layer's
    row, one sentence each. A package's module is named in the row of `package/`; a
    module at the top, in a row of its own file name."""
    rows = code_map(page)
    problems = []
    for name, path in modules(root, package).items():
        relative = path.relative_to(root)
        folder = relative.parent.as_posix()
        if relative == Path("__init__.py"):
            continue
        home = relative.name if folder == "." else f"{folder}/"
        row = next((row for row in rows if home in row[1]), None)
        if row is None:
            problems.append(f"{relative}: no row of the code map is `{home}`")
            continue
        layer, _, named = row
        if (
            folder != "."
            and path.name != "__init__.py"
            and not {relative.stem, relative.name} & named
        ):
            problems.append(
                f"{relative}: the code map's `{home}` row does not name `{relative.stem}`"
            )
        expected = LAYERS[layer_of(name, package)[0]][0]
        if layer != expected:
            problems.append(f"{relative}: the code map puts `{home}` in {layer}, not {expected}")
    return problems


def test_memagent_keeps_its_layers() -> None:
    problems = violations(ROOT, PACKAGE)
    assert not problems, "\n".join(problems)


# `memagent eval` reads through the public API (api.py), as a Python user would: its command
# module imports the library only from these, and evaluation/niah.py for the variant names
# its --help lists.
PUBLIC_ONLY = {
    "memagent_cli.cli.evaluation": ("api", "cli", "views", "evaluation.niah"),
}


def test_the_eval_command_reads_through_the_public_api() -> None:
    known = modules(ROOT, PACKAGE)
    problems = []
    for name, allowed in PUBLIC_ONLY.items():
        for target, line in imports(name, known[name], known):
            relative = target.removeprefix(PACKAGE + ".")
            if not any(relative == a or relative.startswith(a + ".") for a in allowed):
                problems.append(f"{name}:{line} imports {target}, not the public API")
    assert not problems, "\n".join(problems)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / PACKAGE
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    for folder in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        (folder / "__init__.py").touch()
    return root


def test_an_upward_import_a_lazy_one_and_a_cycle_are_each_reported(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "reader.py": "from memagent_cli.views import console\n",  # core -> views
            "views/console.py": "import rich\n",
            "backends/llama.py": (
                "def find():\n    from memagent_cli.models import local\n"  # lazy, sideways
            ),
            "models/local.py": "from memagent_cli.models import hub\n",
            "models/hub.py": "from memagent_cli.models.local import thing\n",  # a cycle
            "documents/pdf.py": "from memagent_cli.documents import Document\n",
            "stray.py": "",
        },
    )
    problems = "\n".join(violations(root, PACKAGE))
    assert "memagent_cli.reader (core) imports memagent_cli.views.console (views)" in problems
    assert "memagent_cli.backends.llama imports memagent_cli.models.local" in problems
    assert "import cycle: memagent_cli.models.hub -> memagent_cli.models.local" in problems
    assert "memagent_cli.documents.pdf imports its own package memagent_cli.documents" in problems
    assert "memagent_cli.stray is in no layer" in problems


def test_imports_down_the_layers_are_allowed(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "cli/main.py": "from memagent_cli.views import console\n",
            "views/console.py": "from memagent_cli.run import batch\n",
            "run/batch.py": "from memagent_cli.documents.load import load\n",
            "documents/load.py": "from memagent_cli.documents import pdf\n",
            "documents/xhtml.py": "from memagent_cli import errors\n",
            "documents/pdf.py": "from . import text\n",
            "documents/text.py": "",
            "errors.py": "",
        },
    )
    assert violations(root, PACKAGE) == []


def rich_imports(path: Path) -> list[int]:
    """The lines of `path` that import Rich, wherever they stand."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if any(name == "rich" or name.startswith("rich.") for name in names):
            found.append(node.lineno)
    return found


def test_the_pure_trace_views_import_no_rich(tmp_path: Path) -> None:
    for relative in PURE_VIEWS:
        assert rich_imports(ROOT / relative) == [], f"{relative} imports Rich"
    lazy = tmp_path / "lazy.py"
    lazy.write_text("import os\n\ndef table():\n    from rich.table import Table\n")
    assert rich_imports(lazy) == [4]  # the check sees an import inside a function


def test_the_code_map_names_every_module_in_its_layer() -> None:
    problems = unmapped(ROOT, PACKAGE, CODE_MAP_PAGE.read_text())
    assert not problems, "\n".join(problems)


def test_a_module_missing_from_the_code_map_or_in_the_wrong_layer_is_reported(
    tmp_path: Path,
) -> None:
    root = _package(
        tmp_path,
        {"reader.py": "", "run/ask.py": "", "run/journal.py": "", "views/html.py": ""},
    )
    page = textwrap.dedent(
        f"""\
        {CODE_MAP_HEADER}
        |---|---|---|
        | run | `run/` | a reading: `ask` (the journal is not named) |
        | parts | `views/` | what a person sees: `html` |

        | core | `reader.py` | below the table's end, so not in it |
        """
    )
    assert unmapped(root, PACKAGE, page) == [
        "reader.py: no row of the code map is `reader.py`",
        "run/journal.py: the code map's `run/` row does not name `journal`",
        "views/__init__.py: the code map puts `views/` in parts, not views",
        "views/html.py: the code map puts `views/` in parts, not views",
    ]
