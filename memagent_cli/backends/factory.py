"""Opening the backend a user asked for: an in-process GGUF model or a server."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from memagent_cli.backends import Backend
from memagent_cli.errors import UserError

KINDS = ("llama", "openai")
DEFAULT_TIMEOUT = 300.0  # seconds a server may take for one call


@dataclass(frozen=True)
class BackendOptions:
    """Which backend, and how to reach or load its model."""

    kind: str = "llama"  # "llama": a GGUF in this process; "openai": a server
    model: str | None = None  # --model: a path, registry name or hf: spec
    base_url: str | None = None
    api_key: str | None = None
    served_model: str | None = None
    encoding: str = "cl100k_base"  # tiktoken, where a server cannot tokenize
    threads: int | None = None  # default: physical cores
    gpu_layers: int | None = None  # default: all when llama.cpp can offload
    timeout: float = DEFAULT_TIMEOUT  # seconds a server may take for one call
    verbose: bool = False
    # llama.cpp engine settings, as llama.cpp names them; speculation is exact either way
    speculate: bool = True
    exact: bool = True  # every decode on llama.cpp's batched kernels: see decoding.py
    flash_attn: str = "off"  # measured faster on CPU: README, Performance
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    batch_size: int = 512
    ubatch_size: int = 512


def open_backend(
    options: BackendOptions,
    note: Callable[[str], None] = lambda message: None,
    progress: Callable[[str, int, int | None], None] | None = None,
) -> Backend:
    """The backend `options` name, its vocabulary ready; a model's weights load later, when
    the run calls `prepare`. An `hf:` model not pulled yet is pulled first, told through
    `note` and `progress(what, done, total)`."""
    if options.kind == "openai":
        from memagent_cli.backends.openai import OpenAIBackend

        if not options.base_url:
            raise UserError("--backend openai needs --base-url (or $MEMAGENT_BASE_URL).")
        return OpenAIBackend(
            options.base_url,
            api_key=options.api_key,
            served_model=options.served_model,
            encoding=options.encoding,
            timeout=options.timeout,
            note=note,
        )
    from memagent_cli import models
    from memagent_cli.backends.llama_cpp import LlamaCppBackend, can_offload, physical_cores

    found = models.resolve(options.model, note=note, progress=progress)
    gpu_layers = options.gpu_layers
    if gpu_layers is None:
        gpu_layers = -1 if can_offload() else 0
    return LlamaCppBackend(
        found.path,
        name=found.name,
        threads=options.threads or physical_cores(),
        gpu_layers=gpu_layers,
        verbose=options.verbose,
        speculate=options.speculate,
        exact=options.exact,
        flash_attn=options.flash_attn,
        cache_type_k=options.cache_type_k,
        cache_type_v=options.cache_type_v,
        batch_size=options.batch_size,
        ubatch_size=options.ubatch_size,
    )
