"""`memagent models pull` of a repository of Hugging Face weights: download config.json,
the tokenizer and the safetensors (resumable, verified), convert, quantize, and leave one
GGUF where `hf:OWNER/NAME:QUANT` and the registry find it."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from rich.filesize import decimal

from memagent_cli import hub
from memagent_cli.conversion import (
    DEFAULT_QUANT,
    Note,
    Progress,
    _silent,
    architecture,
    convert,
    quantize,
    vocabulary,
)

# What a conversion reads; everything else in the repository (README, .bin twins, ...) stays.
_SMALL = (
    "config.json",  # first: it says whether the model can be converted at all
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",  # newer repositories keep the chat template apart
    "chat_template.json",
)
_INDEX = "model.safetensors.index.json"
DOWNLOAD_DIR = "download"  # beside the GGUF, removed once the conversion succeeds


def output_path(repo: str, quant: str) -> Path:
    """Where the GGUF of `repo` quantized to `quant` goes: found again by `find_pulled`."""
    return hub.repo_dir(repo) / f"{repo.split('/')[1]}.{quant}.gguf"


def pull_and_convert(
    spec: hub.Spec,
    commit: str,
    files: dict[str, hub.RemoteFile],
    *,
    note: Note = _silent,
    progress: Progress | None = None,
) -> Path:
    """Download the weights `files` lists, convert them and quantize to `spec.quant`."""
    quant = (
        quantize.file_type(spec.quant or DEFAULT_QUANT)
        .name.removeprefix("MOSTLY_")
        .removeprefix("ALL_")
    )
    dest = output_path(spec.repo, quant)
    if dest.is_file():
        note(f"already pulled: {dest}")
        return dest
    if "tokenizer.json" not in files:
        raise vocabulary.no_tokenizer(spec.repo)
    folder = hub.repo_dir(spec.repo) / DOWNLOAD_DIR
    wanted = [p for p in (*_SMALL, _INDEX) if p in files]
    wanted += sorted(p for p in files if p.endswith(".safetensors") and "/" not in p)
    for path in wanted[:1]:  # config.json first: refuse an unsupported model before the weights
        hub.download(spec.repo, commit, files[path], folder / path)
    arch = architecture.read(folder)
    weights = sum(files[p].size or 0 for p in wanted if p.endswith(".safetensors"))
    to_download = sum(missing_bytes(folder / p, files[p]) for p in wanted)
    parameters = weights // (4 if str(arch.config.get("torch_dtype")) == "float32" else 2)
    if quant in quantize.UNQUANTIZED:
        written = parameters * (4 if quant == "F32" else 2)
        plan = f"writing {quant} {decimal(written)}"
    else:
        written = parameters * 2 + quantize.estimated_size(parameters, quant)
        final = decimal(quantize.estimated_size(parameters, quant))
        plan = f"writing F16 {decimal(parameters * 2)} (temporary) and {quant} about {final}"
    needed = to_download + written
    note(
        f"{spec.repo} is published as Hugging Face weights ({arch.hf_name}, about "
        f"{parameters / 1e9:.1f}B parameters): downloading {decimal(to_download)}, {plan}; "
        f"{decimal(needed)} of disk needed in {folder.parent}"
    )
    hub.check_space(folder.parent, needed, f"pulling {spec.repo}")
    for path in wanted[1:]:
        hub.download(spec.repo, commit, files[path], folder / path, note=note, progress=progress)
    name = spec.repo.split("/")[1]
    convert(folder, dest, quant, name=name, note=note, progress=progress)
    shutil.rmtree(folder, ignore_errors=True)
    note(f"removed the downloaded weights ({decimal(weights)}); {dest} is what memagent runs")
    return dest


def is_hf_model(files: Iterable[str]) -> bool:
    """Whether a repository holds Hugging Face weights: config.json and safetensors."""
    names = set(files)
    return "config.json" in names and any(n.endswith(".safetensors") for n in names)


def missing_bytes(dest: Path, remote: hub.RemoteFile) -> int:
    """How much of `remote` is still to download to `dest` (0 when it is there)."""
    if dest.is_file() and (remote.size is None or dest.stat().st_size == remote.size):
        return 0
    partial = hub.partial_path(dest, remote)
    have = partial.stat().st_size if partial.is_file() else 0
    return max(0, (remote.size or 0) - have)
