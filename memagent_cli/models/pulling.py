"""`memagent models pull` of a repository of Hugging Face weights: download config.json,
the tokenizer and the safetensors (resumable, verified), convert, quantize, and leave one
GGUF where `hf:OWNER/NAME:QUANT` and the registry find it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

from rich.filesize import decimal

from memagent_cli import readers
from memagent_cli.errors import STOPS, ModelError
from memagent_cli.models import gguf, hub, registry
from memagent_cli.models.conversion import architecture, quantize, vocabulary
from memagent_cli.models.conversion.convert import (
    DEFAULT_QUANT,
    intermediate_path,
    peak_releasing_sources,
    plan,
    quantize_intermediate,
)
from memagent_cli.models.conversion.convert import convert as convert_folder
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


def pull_spec(
    spec: hub.Spec,
    *,
    note: Note = silent,
    progress: Progress | None = None,
    delete_shards: bool = False,
) -> Path:
    """Fetch the model `spec` names: its GGUF (every part of a split model), or, for a
    repository of Hugging Face weights, the weights converted and quantized to
    `spec.quant` (see pull_and_convert for `delete_shards`). Returns the first GGUF file."""
    endpoint = hub.endpoint_url()
    commit, files = hub.list_files(spec.repo, endpoint)
    if not any(hub.is_model(p) for p in files) and is_hf_model(files):
        return pull_and_convert(
            spec, commit, files, note=note, progress=progress, delete_shards=delete_shards
        )
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
    delete_shards: bool = False,
) -> Path:
    """Download the weights `files` lists, convert them and quantize to `spec.quant`; a
    complete intermediate from an earlier run is quantized without them. With
    `delete_shards`, each downloaded shard is deleted once its tensors are converted: the
    disk peak drops by nearly the size of the weights, but a conversion that fails before
    its intermediate is complete downloads them again."""
    quant = quantize.quant_type(spec.quant or DEFAULT_QUANT).value  # before any download
    dest = output_path(spec.repo, quant)
    if dest.is_file():
        try:
            gguf.read(dest)  # a file of zeros after a power loss is not a model
        except ModelError as exc:
            note(f"{dest} is damaged ({exc.message.rstrip('.')}); making it again")
            dest.unlink()
        else:
            note(f"already pulled: {dest}")
            return dest
    if "tokenizer.json" not in files:
        raise vocabulary.no_tokenizer(spec.repo)
    folder = hub.repo_dir(spec.repo) / DOWNLOAD_DIR
    # config.json first: refuse an unsupported model before the weights; then the index,
    # which says which shards hold the weights (a repository may hold others).
    first = [p for p in ("config.json", _INDEX) if p in files]
    for path in first:
        hub.download(spec.repo, commit, files[path], folder / path)
    arch = architecture.read(folder)
    shards = _shards(spec.repo, folder, files)
    weights = sum(files[p].size or 0 for p in shards)
    dtype = str(arch.config.get("dtype") or arch.config.get("torch_dtype") or "")
    parameters = weights // (4 if dtype == "float32" else 2)
    # Every GGUF written holds the vocabulary: less than tokenizer.json takes (Source's sizes).
    vocabulary_bytes = files["tokenizer.json"].size or 0
    reused = _reusable_intermediate(dest, quant, folder, shards, dtype)
    wanted = [] if reused else [p for p in _SMALL if p in files and p not in first] + shards
    to_download = sum(missing_bytes(folder / p, files[p]) for p in [*first, *wanted])
    if reused:  # what a failed quantization left: only the quantization is still to do
        final = quantize.estimated_size(parameters, quant) + vocabulary_bytes
        writing = f"quantizing {reused.name} from an earlier run to {quant} about "
        writing += f"{decimal(final)}, without downloading the weights again"
        written = final
        memory = quantize.memory_needed(_largest_tensor(arch.config), quant)
    elif quant in quantize.UNQUANTIZED:
        written = parameters * (4 if quant == "F32" else 2) + vocabulary_bytes
        writing = f"writing {quant} {decimal(written)}"
        converted = written  # what the conversion writes while the shards are there
        memory = 0  # the converter streams: no quantizer
    else:
        converted = parameters * 2 + vocabulary_bytes
        final = quantize.estimated_size(parameters, quant) + vocabulary_bytes
        writing = f"writing an intermediate {decimal(converted)} (temporary) and {quant} "
        writing += f"about {decimal(final)}"
        written = converted + final
        memory = quantize.memory_needed(_largest_tensor(arch.config), quant)
    needed = to_download + written
    hint = ""
    if not reused:  # with --delete-shards each shard goes once its tensors are written
        largest = max((files[p].size or 0 for p in shards), default=0)
        here = weights - sum(missing_bytes(folder / p, files[p]) for p in shards)
        lower = peak_releasing_sources(converted, written, largest, weights, here, to_download)
        if delete_shards:
            needed = lower
        elif lower < needed:
            hint = f"--delete-shards needs {decimal(lower)}"
    note(
        f"{spec.repo} is published as Hugging Face weights ({arch.hf_name}, about "
        f"{parameters / 1e9:.1f}B parameters): "
        + (writing if reused else f"downloading {decimal(to_download)}, {writing}")
        + ("; each shard deleted once converted" if delete_shards and not reused else "")
    )
    check_room(folder.parent, needed, memory, f"pulling {spec.repo}", note, disk_hint=hint)
    for path in wanted:
        hub.download(spec.repo, commit, files[path], folder / path, note=note, progress=progress)
    name = spec.repo.split("/")[1]

    def release(shard: Path) -> None:
        size = shard.stat().st_size
        shard.unlink()
        note(f"deleted {shard.name} ({decimal(size)}): its tensors are converted")

    try:
        if reused:
            note(f"using {reused} from an earlier run")
            quantize_intermediate(reused, dest, quant, label=name, note=note, progress=progress)
        else:
            convert_folder(
                folder,
                dest,
                quant,
                name=name,
                reader=registry.reader_for(hub.PREFIX + spec.repo),
                note=note,
                progress=progress,
                release=release if delete_shards else None,
            )
    except ModelError as exc:
        raise ModelError(f"{exc.message} {_downloads_left(folder, spec.repo)}") from None
    except STOPS:  # Ctrl-C, SIGTERM
        note(_downloads_left(folder, spec.repo))
        raise
    left = _bytes_in(folder)
    shutil.rmtree(folder, ignore_errors=True)
    note(f"removed the downloaded weights ({decimal(left)}); {dest} is what memagent runs")
    return dest


def _reusable_intermediate(
    dest: Path, quant: str, folder: Path, shards: list[str], dtype: str
) -> Path | None:
    """The complete intermediate of `dest` that an earlier pull left, when no shard here is
    newer (as `plan` checks): quantizing it needs none of the weights, which a pull with
    --delete-shards has deleted."""
    if quant in quantize.UNQUANTIZED:
        return None
    for kind in ("BF16", "F16") if dtype == "bfloat16" else ("F16", "BF16"):
        path = intermediate_path(dest, quant, kind)
        if path.is_file() and all(
            not (folder / p).is_file() or (folder / p).stat().st_mtime <= path.stat().st_mtime
            for p in shards
        ):
            return path
    return None


def _downloads_left(folder: Path, repo: str) -> str:
    """The sentence a failed pull ends with: what it leaves of the downloads, and how to
    remove them."""
    return (
        f"The downloaded weights ({decimal(_bytes_in(folder))}) stay in {folder} for the next "
        f"run; `memagent models rm {repo}` deletes them, with every type of {repo} pulled."
    )


def _bytes_in(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _shards(repo: str, folder: Path, files: dict[str, hub.RemoteFile]) -> list[str]:
    """The safetensors files that hold the weights: those the index names, else every one
    at the top of the repository (a model in one file has no index)."""
    if _INDEX not in files:
        return sorted(p for p in files if p.endswith(".safetensors") and "/" not in p)
    index = folder / _INDEX
    try:
        weight_map = json.loads(index.read_text("utf-8"))["weight_map"]
        named = sorted({str(file) for file in weight_map.values()})
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise ModelError(f"{repo}'s {_INDEX} is not a valid safetensors index.") from None
    if missing := [p for p in named if p not in files]:
        raise ModelError(f"{repo}'s {_INDEX} names {missing[0]}, which the repository lacks.")
    return named


def _largest_tensor(config: dict[str, object]) -> int:
    """Values in a model's largest tensor, from config.json: the embedding (and output),
    vocabulary by width, or an FFN matrix, as in Qwen2 and Qwen3."""

    def number(key: str) -> int:
        value = config.get(key)
        return value if isinstance(value, int) else 0

    width = number("hidden_size")
    return width * max(number("vocab_size"), number("intermediate_size"))


def check_room(
    folder: Path, disk: int, memory: int, what: str, note: Note = silent, disk_hint: str = ""
) -> None:
    """Say what `what` needs of disk in `folder` and of memory (0: none to speak of), and
    refuse with one sentence, before anything is written, when either is short;
    `disk_hint` (the way to need less disk) ends it when the disk is."""
    free = shutil.disk_usage(_existing(folder)).free
    available = quantize.available_memory()
    said = f"{decimal(disk)} of disk needed in {folder} ({decimal(free)} free)"
    if memory:
        said += f", about {decimal(memory)} of memory ({decimal(available)} available)"
    note(said)
    short = []
    if disk > free:
        short.append(f"disk space in {folder} ({decimal(disk)} needed, {decimal(free)} free)")
    if memory > available:
        short.append(
            f"memory (about {decimal(memory)} needed: llama.cpp's quantizer holds the largest "
            f"tensor as float32; {decimal(available)} available)"
        )
    if short:
        hint = f"; {disk_hint}" if disk_hint and disk > free else ""
        raise ModelError(f"Not enough {' nor '.join(short)} for {what}{hint}.")


def _existing(folder: Path) -> Path:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


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


def pull(
    value: str,
    *,
    note: Note = silent,
    progress: Progress | None = None,
    delete_shards: bool = False,
) -> Model:
    """Fetch the model `value` names: a registry name (`NAME[:QUANT]`) or
    `[hf:]OWNER/NAME[:QUANT]`; a repository of Hugging Face weights is converted (each
    shard deleted once converted, with `delete_shards`)."""
    entries = registry.registry()
    name, _, quant = value.partition(":")
    if name in entries:
        entry = entries[name]
        if entry.get("hf"):
            spec = hub.parse(str(entry["hf"]))
            if quant:
                spec = hub.Spec(spec.repo, quant)
            path = pull_spec(spec, note=note, progress=progress, delete_shards=delete_shards)
            return Model(path, value)
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
    path = pull_spec(hub.parse(value), note=note, progress=progress, delete_shards=delete_shards)
    return Model(path, registry.hub_name(path))


def convert(
    folder: Path,
    *,
    quant: str = "Q4_K_M",
    out: Path | None = None,
    keep_intermediate: bool = False,
    reader: str | None = None,
    note: Note = silent,
    progress: Progress | None = None,
) -> Model:
    """Convert a local Hugging Face model folder to a GGUF quantized to `quant`. Without
    `out`, the file goes where `--model` finds it: beside the pulls of the registry model
    whose repository has the folder's name, else in the models folder. The file records
    `reader`, else that registry model's reader, else MemAgent's."""
    folder = folder.expanduser()
    tag = quantize.quant_type(quant).value
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
    if tag not in quantize.UNQUANTIZED:  # the quantizer's memory, with the disk, up front
        work = plan(folder, out, tag)
        largest = max(tensor.elements for _, tensor in work.source.tensors)
        memory = quantize.memory_needed(largest, tag)
        check_room(out.parent, work.needed, memory, f"converting {folder}", note)
    if reader is None:
        reader = registry.reader_for(registered[0]) if registered else readers.DEFAULT
    convert_folder(
        folder,
        out,
        tag,
        keep_intermediate=keep_intermediate,
        reader=reader,
        note=note,
        progress=progress,
    )
    if registered and registered[1].quant.upper() == tag:
        return Model(out, registered[0])
    return Model(out, registry.hub_name(out))
