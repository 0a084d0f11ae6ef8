"""What `OWNER/NAME[:QUANT]` names: a GGUF file of a Hub repository, chosen the way
llama.cpp's `-hf` chooses it, and where a pulled one lies on this disk (the user data
folder's models/hf/OWNER/NAME/, so that `hf:OWNER/NAME:QUANT` finds it again without asking
the Hub)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from memagent_cli.errors import ModelError
from memagent_cli.folders import data_dir
from memagent_cli.gguf_header import split_parts
from memagent_cli.models.gguf import quant_tag
from memagent_cli.models.hub.listing import RemoteFile
from memagent_cli.progress import Note

PREFIX = "hf:"
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")  # llama.cpp's -hf choice when no tag is given
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Spec:
    """A GGUF on the Hub: a repository and a quantization tag ("" for llama.cpp's default),
    or an exact file path in the repository (a tag that ends in .gguf)."""

    repo: str
    quant: str = ""

    def __str__(self) -> str:
        return f"{self.repo}:{self.quant}" if self.quant else self.repo


def parse(text: str) -> Spec:
    """`[hf:]OWNER/NAME[:QUANT]` as a Spec; ModelError if it is not one."""
    repo, _, quant = text.removeprefix(PREFIX).partition(":")
    if not _REPO.match(repo):
        raise ModelError(
            f"{text} is not a Hugging Face repository: write OWNER/NAME[:QUANT], "
            "e.g. bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M."
        )
    return Spec(repo, quant.strip())


def looks_like_repo(text: str) -> bool:
    return text.startswith(PREFIX) or bool(_REPO.match(text.partition(":")[0]))


def models_dir() -> Path:
    """Where pulled models go: the user data folder's models/."""
    return data_dir() / "models"


def repo_dir(repo: str) -> Path:
    owner, name = repo.split("/")
    return models_dir() / "hf" / owner / name


def spec_of(path: Path) -> Spec | None:
    """The Spec a pulled file answers to, from where it lies; None if it was not pulled."""
    try:
        owner, name, *_ = path.relative_to(models_dir() / "hf").parts
    except ValueError:
        return None
    return Spec(f"{owner}/{name}", quant_tag(path.name) or path.name)


def choose(paths: Iterable[str], quant: str, repo: str = "") -> list[str]:
    """The files to fetch for `quant`: the model file first, then its other split parts.

    As llama.cpp: the first model GGUF (not mmproj or imatrix) whose path holds the tag
    (tag_pattern); without a tag Q4_K_M, then Q8_0, then the first model GGUF. A tag
    ending in .gguf names the file itself.
    """
    paths = sorted(paths)
    models = [p for p in paths if is_model(p) and split_parts(Path(p))[0] == 1]
    if quant.lower().endswith(".gguf"):
        primary = next((p for p in paths if p == quant), None)
    else:
        primary = None
        for tag in [quant] if quant else DEFAULT_QUANTS:
            pattern = tag_pattern(tag)
            if primary := next((p for p in models if pattern.search(p)), None):
                break
        if primary is None and not quant and models:
            primary = models[0]
    if primary is None:
        where = f" in {repo}" if repo else ""
        if not models:
            raise ModelError(f"There is no GGUF model file{where}.")
        tags = sorted({quant_tag(p) or p for p in models})
        raise ModelError(f"No GGUF file{where} matches {quant}; available: {', '.join(tags)}.")
    return [primary] + _other_parts(primary, paths)


def tag_pattern(tag: str) -> re.Pattern[str]:
    """A quantization tag in a file's path: followed by `.` or `-`, ignoring case, as
    llama.cpp matches it, and, unlike a bare substring, not the end of a longer name:
    F16 is not BF16."""
    return re.compile(r"(?<![a-z0-9])" + re.escape(tag) + r"[.-]", re.IGNORECASE)


def find_pulled(spec: Spec) -> Path | None:
    """The local file for `spec` if it was pulled, all split parts present; no network."""
    folder = repo_dir(spec.repo)
    if not folder.is_dir():
        return None
    local = [p.relative_to(folder).as_posix() for p in folder.rglob("*.gguf") if p.is_file()]
    try:
        chosen = choose(local, spec.quant)
    except ModelError:
        return None
    if split_parts(Path(chosen[0]))[1] != len(chosen):
        return None  # a split model with parts missing
    return folder / chosen[0]


def is_model(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.endswith(".gguf") and "mmproj" not in name and "imatrix" not in name


def _other_parts(primary: str, paths: list[str]) -> list[str]:
    index, count = split_parts(Path(primary))
    if count == 1:
        return []
    prefix = primary[: -len(f"-00001-of-{count:05d}.gguf")]
    return [f"{prefix}-{i:05d}-of-{count:05d}.gguf" for i in range(2, count + 1)]


def note_other_matches(spec: Spec, files: dict[str, RemoteFile], primary: str, note: Note) -> None:
    tag = spec.quant or quant_tag(primary)
    pattern = tag_pattern(tag)
    others = [
        p
        for p in sorted(files)
        if p != primary and is_model(p) and split_parts(Path(p))[0] == 1 and pattern.search(p)
    ]
    if others:
        note(
            f"{len(others) + 1} files match {tag}; taking {primary}. Name another file "
            f"exactly with {spec.repo}:FILE.gguf (also: {', '.join(others)})."
        )
