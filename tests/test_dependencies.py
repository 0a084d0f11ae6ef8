"""The floors of dependencies that read hostile input: a release below them lacks limits
that memagent's own bounds (docs/reliability.md) rely on."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def floor(name: str) -> Version:
    """The lowest version pyproject.toml allows of `name`."""
    for line in tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]:
        requirement = Requirement(line)
        if requirement.name == name:
            (lowest,) = [s.version for s in requirement.specifier if s.operator == ">="]
            return Version(lowest)
    raise AssertionError(f"{name} is not a dependency")


def test_pypdf_is_a_release_that_bounds_what_a_pdf_inflates_to():
    import pypdf.filters

    # 6.0.0 bounded FlateDecode's output; LZW (6.1.3, 6.4.0), RunLength (6.7.4), a stream's
    # declared /Length (6.8.0), array content streams (6.9.1) and FlateDecode's predictor
    # parameters (6.10.2) came later: each an allocation a small PDF could make huge.
    assert floor("pypdf") >= Version("6.10.2")
    assert Version(version("pypdf")) >= floor("pypdf")
    limits = ("ZLIB_MAX_OUTPUT_LENGTH", "LZW_MAX_OUTPUT_LENGTH", "RUN_LENGTH_MAX_OUTPUT_LENGTH")
    limits += ("MAX_DECLARED_STREAM_LENGTH", "MAX_ARRAY_BASED_STREAM_OUTPUT_LENGTH")
    assert {name: getattr(pypdf.filters, name) for name in limits} == dict.fromkeys(
        limits, 75_000_000
    )  # as docs/reliability.md says


def test_the_http_client_is_used_through_its_public_names_only():
    """The deadline transport (backends/openai/deadline.py) stands on httpx2 and httpcore2,
    allowed up to their next major release (<3): so memagent names only what each exports
    in `__all__`, imports none of their modules, and reads no `_` attribute anywhere."""
    import ast
    import importlib

    packages = {name: importlib.import_module(name) for name in ("httpx2", "httpcore2")}
    used: set[tuple[str, str]] = set()
    private: list[str] = []
    for path in sorted((PYPROJECT.parent / "memagent_cli").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in packages:
                private.append(f"{path.name}: from {node.module} import ...")
            elif isinstance(node, ast.Import):
                private += [
                    f"{path.name}: import {a.name}"
                    for a in node.names
                    if "." in a.name and a.name.split(".")[0] in packages
                ]
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in packages
            ):
                used.add((node.value.id, node.attr))

    assert not private
    assert ("httpcore2", "ConnectionPool") in used  # the check sees the transport
    assert [f"{p}.{a}" for p, a in sorted(used) if a not in packages[p].__all__] == []
    deadline = (PYPROJECT.parent / "memagent_cli/backends/openai/deadline.py").read_text()
    assert "._" not in deadline.replace("self._", "")
