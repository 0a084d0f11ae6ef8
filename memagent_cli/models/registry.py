"""The registry of known models (models/registry.toml) and where their files are found:
the checkout's models/ folder, the user's models folder, or inside a Python package."""

from __future__ import annotations

import importlib.util
import tomllib
from dataclasses import dataclass
from pathlib import Path

from memagent_cli import readers
from memagent_cli.errors import UserError
from memagent_cli.models import hub

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # memagent_cli/
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
                entries = tomllib.load(file)
            for name, entry in entries.items():
                reader_of(name, entry)  # the file ships with memagent: a bad entry is a bug
            return entries
    return {}


def reader_of(name: str, entry: dict[str, object]) -> str:
    """The reader a registry entry's model was trained for: its `reader`, else MemAgent's."""
    reader = str(entry.get("reader", readers.DEFAULT))
    try:
        readers.get(reader)
    except UserError as exc:
        raise ValueError(f"registry entry {name}: {exc.message}") from None
    return reader


def reader_for(name: str) -> str:
    """The reader of the model a user names: its registry entry's, else MemAgent's (a file
    or a Hub repository the registry does not know)."""
    return known_reader(name) or readers.DEFAULT


def known_reader(name: str) -> str | None:
    """The reader of the registry's model `name`; None where the registry does not know
    it. NAME:QUANT, another quantization of an entry, and hf:OWNER/REPO[:QUANT] of an
    entry's repository are the entry's model too."""
    entries = registry()
    base = name.partition(":")[0]
    if name in entries or base in entries:
        key = name if name in entries else base
        return reader_of(key, entries[key])
    if name.startswith(hub.PREFIX):
        repo = hub.parse(name).repo.lower()  # the Hub's names ignore case
        for key, entry in entries.items():
            if entry.get("hf") and hub.parse(str(entry["hf"])).repo.lower() == repo:
                return reader_of(key, entry)
    return None


def install_check(name: str) -> bool:
    """Whether the model a user names is in the registry only to check the install: too
    small to answer a real question."""
    return bool(registry().get(name, {}).get("install_check"))


def model_dirs() -> list[Path]:
    """Folders searched for registry models' files."""
    return [_CHECKOUT_MODELS, hub.models_dir()]


def default_name() -> str:
    return next((name for name, entry in registry().items() if entry.get("default")), "")


def hub_name(path: Path) -> str:
    spec = hub.spec_of(path)
    return f"{hub.PREFIX}{spec}" if spec else path.stem


def find_file(name: str) -> Path | None:
    entry = registry()[name]
    if entry.get("hf") and (pulled := hub.find_pulled(hub.parse(str(entry["hf"])))):
        return pulled
    file = str(entry.get("file", ""))
    if not file:
        return None
    folders = list(model_dirs())
    if package := entry.get("package"):
        spec = importlib.util.find_spec(str(package))  # locates without importing it
        if spec and spec.submodule_search_locations:
            folders.extend(Path(p) for p in spec.submodule_search_locations)
    return next((f / file for f in folders if (f / file).is_file()), None)


def how_to_get(name: str, entry: dict[str, object]) -> str:
    if entry.get("hf"):
        return f"pull it with `memagent models pull {name}`"
    if entry.get("how"):
        return str(entry["how"])
    return f"pip install {entry['pip']}" if entry.get("pip") else ""


def missing_file(name: str, entry: dict[str, object]) -> str:
    where = " or ".join(str(d) for d in model_dirs())
    how = how_to_get(name, entry)
    if entry.get("file"):
        known = f"Model {name} is known but its file {entry['file']} is not in {where}"
    else:  # a Hub entry: its file's name is known only once pulled
        known = f"Model {name} ({entry.get('hf')} on the Hugging Face Hub) is not pulled yet"
    return known + (f"; {how}." if how else ".")
