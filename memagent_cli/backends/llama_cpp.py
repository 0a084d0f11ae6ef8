"""In-process GGUF models through llama-cpp-python (CPU, or CUDA/Metal offload when built so)."""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from memagent_cli.backends import Generation, Sampling
from memagent_cli.errors import ModelError

_GGUF_MAGIC = b"GGUF"


def physical_cores() -> int:
    """Physical cores this process may use: llama.cpp slows down badly on hyperthreads."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores: set[tuple[str, str]] = set()
    try:
        physical = core = ""
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "physical id":
                physical = value.strip()
            elif key == "core id":
                core = value.strip()
                cores.add((physical, core))
    except OSError:
        pass
    return max(1, min(len(cores) or usable or 1, usable or 1))


def can_offload() -> bool:
    """Whether this llama.cpp build can put layers on a GPU (CUDA, Metal, ...)."""
    import llama_cpp

    return bool(llama_cpp.llama_supports_gpu_offload())


def check_gguf(path: Path) -> None:
    """Fail with a sentence unless `path` starts like a GGUF file."""
    try:
        with path.open("rb") as file:
            magic = file.read(4)
    except OSError as exc:
        raise ModelError(f"Cannot read model {path}: {exc.strerror}.") from None
    if magic != _GGUF_MAGIC:
        raise ModelError(f"{path} is not a GGUF model file (llama.cpp reads GGUF models only).")


_log_callback = None  # ctypes keeps only a pointer: hold the callback here


def _route_llama_log(verbose: bool) -> None:
    """Send llama.cpp's own log to stderr with --verbose, and nowhere otherwise."""
    global _log_callback
    import llama_cpp

    @llama_cpp.llama_log_callback
    def callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        if verbose:
            sys.stderr.write(text.decode("utf-8", errors="replace"))

    _log_callback = callback
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))


class LlamaCppBackend:
    """A GGUF model run in this process.

    Opened in two stages: the vocabulary first (fast, enough to tokenize and to size the
    context), then the weights with exactly the context one MemAgent step needs.
    """

    def __init__(self, path: Path, *, threads: int, gpu_layers: int, verbose: bool = False) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        check_gguf(path)
        _route_llama_log(verbose)
        self.path = path
        self.name = path.stem
        self.threads = threads
        self.gpu_layers = gpu_layers
        self._verbose = verbose
        try:
            self._vocab = Llama(model_path=str(path), vocab_only=True, verbose=verbose)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"llama.cpp could not load {path}: {exc}.") from None
        template = self._vocab.metadata.get("tokenizer.chat_template")
        if not template:
            raise ModelError(
                f"{path} has no chat template in its metadata; MemAgent prompts must go "
                "through the model's own chat template."
            )
        # The weights are not loaded yet, so read the trained context from the metadata.
        metadata = self._vocab.metadata
        arch = metadata.get("general.architecture", "")
        self.context_limit = int(metadata.get(f"{arch}.context_length", 0)) or 2048
        eos_id, bos_id = self._vocab.token_eos(), self._vocab.token_bos()
        self._formatter = Jinja2ChatFormatter(
            template=template,
            eos_token=self._token_text(eos_id),
            bos_token=self._token_text(bos_id),
            stop_token_ids=[eos_id] if eos_id >= 0 else None,
        )
        self._llm: Llama | None = None
        self.context_tokens = 0

    def _token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self._vocab.detokenize([token], special=True).decode("utf-8", errors="replace")

    def tokenize(self, text: str) -> list[int]:
        return self._vocab.tokenize(text.encode("utf-8"), add_bos=False, special=False)

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        return self._vocab.detokenize(list(tokens))

    def _chat_prompt(self, message: str) -> tuple[list[int], list[str]]:
        rendered = self._formatter(messages=[{"role": "user", "content": message}])
        tokens = self._vocab.tokenize(
            rendered.prompt.encode("utf-8"), add_bos=not rendered.added_special, special=True
        )
        stop = rendered.stop if isinstance(rendered.stop, list) else [rendered.stop]
        return tokens, [s for s in stop if s]

    def chat_overhead(self) -> int:
        return len(self._chat_prompt("")[0])

    def prepare(self, context_tokens: int) -> None:
        from llama_cpp import Llama

        self.context_tokens = context_tokens
        try:
            self._llm = Llama(
                model_path=str(self.path),
                n_ctx=context_tokens,
                n_batch=min(512, context_tokens),
                n_threads=self.threads,
                n_threads_batch=self.threads,
                n_gpu_layers=self.gpu_layers,
                verbose=self._verbose,
            )
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"llama.cpp could not load {self.path}: {exc}.") from None

    def generate(self, message: str, *, max_tokens: int, sampling: Sampling) -> Generation:
        if self._llm is None:
            raise RuntimeError("prepare() must be called before generate()")
        prompt, stop = self._chat_prompt(message)
        if len(prompt) + max_tokens > self.context_tokens:
            raise RuntimeError(
                f"prompt {len(prompt)} + reply {max_tokens} exceeds context {self.context_tokens}"
            )
        import llama_cpp

        context = self._llm._ctx.ctx  # perf counters split prompt reading from generating
        llama_cpp.llama_perf_context_reset(context)
        start = time.perf_counter()
        result = self._llm.create_completion(
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            # The paper sampled with vLLM's defaults: no top-k, min-p or repeat penalty.
            top_k=0,
            min_p=0.0,
            repeat_penalty=1.0,
            seed=sampling.seed,
            stop=stop,
        )
        seconds = time.perf_counter() - start
        perf = llama_cpp.llama_perf_context(context)
        choice = result["choices"][0]
        return Generation(
            text=choice["text"],
            prompt_tokens=result["usage"]["prompt_tokens"],
            completion_tokens=result["usage"]["completion_tokens"],
            prompt_seconds=min(perf.t_p_eval_ms / 1000, seconds),
            seconds=seconds,
            finish_reason=choice.get("finish_reason") or "stop",
        )
