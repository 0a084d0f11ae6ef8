"""`memagent models pull` of a repository of Hugging Face weights: download config.json,
the tokenizer and the safetensors (resumable, verified), convert, quantize, and leave one
GGUF where `hf:OWNER/NAME:QUANT` and the registry find it."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from rich.filesize import decimal

from memagent_cli.errors import ModelError
from memagent_cli.models import hub, registry
from memagent_cli.models.conversion import architecture, quantize, vocabulary
from memagent_cli.models.conversion.convert import DEFAULT_QUANT
from memagent_cli.models.conversion.convert import convert as convert_folder
from memagent_cli.models.conversion.quantize import file_type
from memagent_cli.models.registry import Model
from memagent_cli.progress import Note, Progress, silent

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


def pull_spec(spec: hub.Spec, *, note: Note = silent, progress: Progress | None = None) -> Path:
    """Fetch the model `spec` names: its GGUF (every part of a split model), or, for a
    repository of Hugging Face weights, the weights converted and quantized to
    `spec.quant`. Returns the first GGUF file."""
    endpoint = hub.endpoint_url()
    commit, files = hub.list_files(spec.repo, endpoint)
    if not any(hub.is_model(p) for p in files) and is_hf_model(files):
        return pull_and_convert(spec, commit, files, note=note, progress=progress)
    chosen = hub.choose(files, spec.quant, spec.repo)
    if not spec.quant.lower().endswith(".gguf"):
        hub.note_other_matches(spec, files, chosen[0], note)
    folder = hub.repo_dir(spec.repo)
    for path in chosen:
        hub.download(spec.repo, commit, files[path], folder / path, note=note, progress=progress)
    return folder / chosen[0]


def pull_and_convert(
    spec: hub.Spec,
    commit: str,
    files: dict[str, hub.RemoteFile],
    *,
    note: Note = silent,
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
    convert_folder(folder, dest, quant, name=name, note=note, progress=progress)
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


def pull(value: str, *, note: Note = silent, progress: Progress | None = None) -> Model:
    """Fetch the model `value` names: a registry name (`NAME[:QUANT]`) or
    `[hf:]OWNER/NAME[:QUANT]`; a repository of Hugging Face weights is converted."""
    entries = registry.registry()
    name, _, quant = value.partition(":")
    if name in entries:
        entry = entries[name]
        if entry.get("hf"):
            spec = hub.parse(str(entry["hf"]))
            if quant:
                spec = hub.Spec(spec.repo, quant)
            return Model(pull_spec(spec, note=note, progress=progress), value)
        if found := registry.find_file(name):
            note(f"{name} is already installed: {found}")
            return Model(found, name)
        raise ModelError(f"{name} cannot be pulled: {registry.how_to_get(name, entry)}.")
    if not hub.looks_like_repo(value):
        known = ", ".join(entries) or "none"
        raise ModelError(
            f"{value} is neither a registry name (known names: {known}) nor a Hugging Face "
            "repository OWNER/NAME[:QUANT]."
        )
    path = pull_spec(hub.parse(value), note=note, progress=progress)
    return Model(path, registry.hub_name(path))


def convert(
    folder: Path,
    *,
    quant: str = "Q4_K_M",
    out: Path | None = None,
    keep_intermediate: bool = False,
    note: Note = silent,
    progress: Progress | None = None,
) -> Model:
    """Convert a local Hugging Face model folder to a GGUF quantized to `quant`. Without
    `out`, the file goes where `--model` finds it: beside the pulls of the registry model
    whose repository has the folder's name, else in the models folder."""
    folder = folder.expanduser()
    tag = file_type(quant).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    name = folder.resolve().name
    registered = next(
        (
            (key, spec)
            for key, entry in registry.registry().items()
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
    convert_folder(
        folder,
        out,
        tag,
        keep_intermediate=keep_intermediate,
        note=note,
        progress=progress,
    )
    if registered and registered[1].quant.upper() == tag:
        return Model(out, registered[0])
    return Model(out, registry.hub_name(out))
