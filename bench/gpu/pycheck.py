"""Python-side checks for .gpu/run.sh on the GPU machine (standard library + packaging).

    python3 .gpu/pycheck.py satisfied 'scikit-build-core>=0.9.2'   # exit 0 when met
    python3 .gpu/pycheck.py needed .gpu/whl-ifneeded/*.whl         # the wheels to install
    python3 .gpu/pycheck.py report                                 # requirements vs installed
    python3 .gpu/pycheck.py imports [--llama]                      # import what memagent uses

Versions are read the way Python imports: the first distribution on sys.path wins, so
PYTHONPATH=/tmp/site shadows the image's own copy (huggingface_hub 1.x there, 2.4 carried).
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import sys
import tomllib
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
SITE = Path("/tmp/site")


def installed(name: str) -> tuple[str | None, str]:
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        return None, ""
    return dist.version, str(dist.locate_file(""))


def met(req: Requirement) -> tuple[bool, str | None, str]:
    version, where = installed(req.name)
    ok = version is not None and req.specifier.contains(version, prereleases=True)
    return ok, version, where


def memagent_requirements() -> list[Requirement]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        project = tomllib.load(file)["project"]
    return [Requirement(r) for r in project["dependencies"]]


def applies(req: Requirement, extras: tuple[str, ...] = ("",)) -> bool:
    if req.marker is None:
        return True
    env = default_environment()
    return any(req.marker.evaluate({**env, "extra": extra}) for extra in extras)


def cmd_satisfied(specs: list[str]) -> int:
    bad = 0
    for spec in specs:
        ok, version, where = met(Requirement(spec))
        print(f"{spec}: {'OK' if ok else 'NOT MET'} (found {version} {where})")
        bad += not ok
    return 1 if bad else 0


def cmd_needed(wheels: list[str]) -> int:
    """Print each wheel whose project is missing or below what memagent asks for."""
    wanted = {canonicalize_name(r.name): r for r in memagent_requirements()}
    for wheel in wheels:
        name = canonicalize_name(Path(wheel).name.split("-")[0])
        req = wanted.get(name, Requirement(name))
        ok, version, where = met(req)
        print(f"{name}: want '{req}', found {version} {where}", file=sys.stderr)
        if not ok:
            print(wheel)
    return 0


def cmd_report() -> int:
    """Each requirement of memagent (and llama-cpp-python's, and those of every
    distribution carried into /tmp/site), with the version Python would import."""
    rows: list[tuple[str, str]] = []
    for req in memagent_requirements():
        rows.append(("memagent", str(req)))
    for req in ("typing-extensions>=4.5.0", "numpy>=1.20.0", "diskcache>=5.6.1", "jinja2>=2.11.3"):
        rows.append(("llama-cpp-python", req))
    if SITE.is_dir():
        for dist in md.distributions(path=[str(SITE)]):
            for spec in dist.requires or []:
                req = Requirement(spec)
                if applies(req, extras=("", "crypto")):
                    rows.append((dist.metadata["Name"], str(req).split(";")[0].strip()))
    bad = 0
    for owner, spec in rows:
        ok, version, where = met(Requirement(spec))
        flag = "ok      " if ok else "MISMATCH"
        bad += not ok
        print(f"{flag} {owner:>20}: {spec:<32} found {version} in {where}")
    print(f"{bad} requirement(s) not met (see MISMATCH lines; most matter only to pip)")
    return 0


MODULES = [
    "typer", "rich", "numpy", "lxml.etree", "tiktoken", "tokenizers", "psutil",
    "platformdirs", "pypdf", "cryptography", "gguf", "tenacity", "httpx2", "diskcache",
    "jinja2", "huggingface_hub", "huggingface_hub.utils", "huggingface_hub.errors",
    "fpdf", "ebooklib", "pytest", "xdist",
]  # fmt: skip


def cmd_imports(args: list[str]) -> int:
    modules = list(MODULES)
    if "--llama" in args:
        modules += ["llama_cpp", "memagent_cli.backends.build"]
    modules.append("memagent_cli.cli")
    failed = 0
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a report, not a program
            failed += 1
            print(f"FAIL {name}: {type(exc).__name__}: {exc}")
            continue
        version = getattr(module, "__version__", "")
        print(f"ok   {name} {version} {getattr(module, '__file__', '')}")
    # The pieces memagent_cli/models/hub.py takes from huggingface_hub (all lazily).
    try:
        from huggingface_hub import HfApi, get_session, hf_hub_url, hf_raise_for_status  # noqa: F401
        from huggingface_hub.utils import build_hf_headers  # noqa: F401

        print("ok   huggingface_hub pieces memagent uses")
    except Exception as exc:  # noqa: BLE001
        failed += 1
        print(f"FAIL huggingface_hub pieces: {type(exc).__name__}: {exc}")
    print(f"{failed} import(s) failed")
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("report", [])
    if command == "satisfied":
        return cmd_satisfied(rest)
    if command == "needed":
        return cmd_needed(rest)
    if command == "report":
        return cmd_report()
    if command == "imports":
        return cmd_imports(rest)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
