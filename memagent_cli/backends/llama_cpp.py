"""In-process GGUF models through llama-cpp-python (CPU, or CUDA/Metal offload when built so)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile
import unicodedata
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from memagent_cli import cpus, crash
from memagent_cli.backend import Call, Description, Generation, Raw, Sampling
from memagent_cli.backends import calibration_store
from memagent_cli.chunking import NORMALIZATIONS
from memagent_cli.errors import BudgetError, ModelError
from memagent_cli.files import ENGINE_NOTES, check_gguf
from memagent_cli.progress import Progress

if TYPE_CHECKING:  # decoding imports llama_cpp, which loads the library: only when used
    from memagent_cli.backends.build import Placement
    from memagent_cli.backends.calibration import Calibration
    from memagent_cli.backends.decoding import Decoded, Decoder, Request


# Engine settings under llama.cpp's own names (-fa, -ctk/-ctv).
class FlashAttn(StrEnum):
    """llama.cpp's --flash-attn."""

    on = "on"
    off = "off"
    auto = "auto"


class CacheType(StrEnum):
    """llama.cpp's KV cache types (-ctk, -ctv)."""

    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"
    q8_0 = "q8_0"
    q4_0 = "q4_0"
    q4_1 = "q4_1"
    iq4_nl = "iq4_nl"
    q5_0 = "q5_0"
    q5_1 = "q5_1"


# Bytes per cached value of each type (block size and bytes per block of ggml's types).
_TYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "q8_0": 34 / 32, "q4_0": 18 / 32}
_TYPE_BYTES |= {"q4_1": 20 / 32, "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}
_RESERVE = 1 << 30  # compute buffers and everything else: leave a GiB free
# Stands for the user's message while the chat template renders: no text holds it.
_PLACEHOLDER = "\x00memagent-message\x00"


def physical_cores() -> int:
    """Physical cores this process may use (its affinity and cgroup quota, cpus.py):
    llama.cpp slows down badly on hyperthreads."""
    import psutil

    usable = cpus.usable()
    return max(1, min(psutil.cpu_count(logical=False) or usable, usable))


def can_offload() -> bool:
    """Whether this llama.cpp build can put layers on a GPU (CUDA, Metal, ...)."""
    import llama_cpp

    return bool(llama_cpp.llama_supports_gpu_offload())


@contextlib.contextmanager
def _utf8_name(path: Path) -> Iterator[Path]:
    """`path`, or while llama.cpp opens it, a link to it with a UTF-8 name where its own name
    is not UTF-8 (a Latin-1 name): llama-cpp-python's `Llama` encodes the name as UTF-8."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        with tempfile.TemporaryDirectory(prefix="memagent-") as folder:
            link = Path(folder) / "model.gguf"
            link.symlink_to(path.resolve())
            yield link
        return
    yield path


# llama.cpp's GGML_MAX_N_THREADS: thousands more end in libgomp's "Thread creation failed"
# or a crash, and 2**31 wraps in its int32.
MOST_THREADS = 512


@dataclass(frozen=True)
class LlamaOptions:
    """How llama.cpp runs a model in this process: every engine default, and its check.
    Names follow llama.cpp's own flags."""

    threads: int | None = None  # None: physical cores
    gpu_layers: int | None = None  # None: all when llama.cpp can offload, else 0
    verbose: bool = False  # llama.cpp's own log on stderr
    speculate: bool = True  # draft from the prompt, verify in one batch
    # Every decode on llama.cpp's batched kernels (decoding.py): byte-identical output across
    # speculation and sequences read together, at a cost. Off: single-row kernels where no
    # draft is verified, the path llama.cpp's server and every peer take (docs/performance.md).
    exact: bool = False
    flash_attn: FlashAttn = FlashAttn.off  # measured faster on CPU: docs/performance.md
    cache_type_k: CacheType = CacheType.f16
    cache_type_v: CacheType = CacheType.f16
    batch_size: int = 512
    ubatch_size: int = 512
    # llama.cpp's --repack/--no-repack. None: its repacked layouts, never its AMX buffers,
    # which crash (backends/build.py); True: its own choice, AMX included; False: neither.
    repack: bool | None = None
    # Measure the calibration again even where one is kept (backends/calibration.py).
    recalibrate: bool = False

    def __post_init__(self) -> None:
        """Refuse settings llama.cpp cannot run, with a sentence instead of a crash."""
        if self.flash_attn not in list(FlashAttn):
            raise ModelError(f"Flash attention must be on, off or auto, not {self.flash_attn!r}.")
        for which, kind in (("K", self.cache_type_k), ("V", self.cache_type_v)):
            if kind not in list(CacheType):
                raise ModelError(
                    f"Unknown {which} cache type {kind!r}; llama.cpp accepts "
                    f"{', '.join(CacheType)}."
                )
        if self.flash_attn == "off" and self.cache_type_v not in ("f32", "f16", "bf16"):
            raise ModelError(
                f"A quantized V cache ({self.cache_type_v}) needs flash attention; "
                "use --flash-attn on or a V cache type of f16."
            )
        if self.batch_size < 1 or self.ubatch_size < 1:
            raise ModelError("Batch and ubatch sizes must be at least 1.")
        if self.threads is not None and not 1 <= self.threads <= MOST_THREADS:
            raise ModelError(f"--threads must be at least 1 and at most {MOST_THREADS}.")


class LlamaCppBackend:
    threaded = False  # readings at once are sequences of one context, decoded together
    local = True
    """A GGUF model run in this process.

    Opened in two stages: the vocabulary first (fast, enough to tokenize and to size the
    context), then the weights with exactly the context one MemAgent step needs.
    """

    def __init__(
        self, path: Path, options: LlamaOptions = LlamaOptions(), *, name: str | None = None
    ) -> None:
        import llama_cpp
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        from memagent_cli.backends.llama_parts import Pieces

        self.options = options
        self.speculate, self.exact = options.speculate, options.exact
        self.flash_attn = str(options.flash_attn)
        self.cache_type_k, self.cache_type_v = str(options.cache_type_k), str(options.cache_type_v)
        self.batch_size, self.ubatch_size = options.batch_size, options.ubatch_size
        check_gguf(path)
        verbose = options.verbose
        from memagent_cli.backends.llama_patches import LlamaLog

        # llama.cpp's log, printable, on stderr with --verbose; as it was once this is gone.
        weakref.finalize(self, LlamaLog(verbose).restore)
        self.path = path
        self.name = name or path.stem
        self.threads = options.threads or physical_cores()
        if options.threads is not None and options.threads > (usable := cpus.usable()):
            ENGINE_NOTES.info(
                f"--threads {options.threads} is more than the {usable} CPU"
                f"{'s' if usable != 1 else ''} this process may use: llama.cpp's threads then "
                "wait on each other, 10-100x slower; leave --threads out to use the physical "
                "cores."
            )
        self.gpu_layers = options.gpu_layers
        if self.gpu_layers is None:
            self.gpu_layers = -1 if can_offload() else 0
        self._verbose = verbose
        try:
            with _utf8_name(path) as named:
                self._vocab = Llama(model_path=str(named), vocab_only=True, verbose=verbose)
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
        self.normalization = NORMALIZATIONS.get(metadata.get("tokenizer.ggml.pre", ""))
        arch = metadata.get("general.architecture", "")
        self.context_limit = int(metadata.get(f"{arch}.context_length", 0)) or 2048
        # A document's tokens as text, every one: llama.cpp makes some plain words control
        # tokens (Qwen2's `</s>`), which are text to the authors' tokenizer.
        self._pieces = Pieces(llama_cpp.llama_model_get_vocab(self._vocab.model), special=True)
        eos_id, bos_id = self._vocab.token_eos(), self._vocab.token_bos()
        self._formatter = Jinja2ChatFormatter(
            template=template,
            eos_token=self._token_text(eos_id),
            bos_token=self._token_text(bos_id),
            stop_token_ids=[eos_id] if eos_id >= 0 else None,
        )
        self._template = self._render_template()  # once: every call's prompt wraps it
        self._engine: _Loaded | None = None
        self._calibration: Calibration | None = None  # measured or read at prepare()
        self._disputed = False  # the readings disputed the calibration: said once
        self.context_tokens = 0  # per sequence
        self.sequences = 1

    def _token_text(self, token: int) -> str:
        from memagent_cli.backends.llama_parts import piece

        if token < 0:
            return ""
        return piece(self._pieces.vocab, token, special=True).decode("utf-8", errors="replace")

    def _normal(self, text: str) -> str:
        """`text` as the model's own tokenizer normalizes it before splitting."""
        if self.normalization is None or unicodedata.is_normalized(self.normalization, text):
            return text
        return unicodedata.normalize(self.normalization, text)

    def tokenize(self, text: str) -> list[int]:
        text = self._normal(text)
        return self._vocab.tokenize(text.encode("utf-8"), add_bos=False, special=False)

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        """Every token's bytes, at any length (llama_parts.piece), not llama-cpp-python's
        own detokenize, which drops pieces longer than 32 bytes and control tokens."""
        return self._pieces.join(tokens)

    def _chat_prompt(self, message: str) -> tuple[list[int], list[str]]:
        """The chat prompt's tokens: the template's own markup with its control tokens, and
        the message (a document's words, a memory, a question) as plain text, so that a
        document spelling `<|im_end|>` cannot write a turn. The tokens are those of the
        whole prompt parsed at once, unless the message spells a special token (or starts
        with a newline, which a tokenizer may join with the template's: MemAgent's
        messages never do)."""
        before, after, bos, stop = self._template
        message = self._normal(message)
        text = self._vocab.tokenize(message.encode("utf-8"), add_bos=bos, special=False)
        return [*before, *text, *after], stop

    def _raw(self, raw: Raw) -> tuple[list[int], list[str]]:
        """A prompt written whole: control tokens parsed in its markup only, so that a
        document spelling `<|im_end|>` in a text piece cannot write a turn. It ends at the
        model's end of turn alone (no stop strings), as a completion does."""
        tokens = [
            token
            for text, markup in raw
            for token in self._vocab.tokenize(
                self._normal(text).encode("utf-8"), add_bos=False, special=markup
            )
        ]
        return tokens, []

    def _render_template(self) -> tuple[list[int], list[int], bool, list[str]]:
        """The chat template rendered once around a placeholder for the message: the tokens
        before and after it (control tokens parsed), whether the message's first token is
        the BOS, and the stop strings."""
        rendered = self._formatter(messages=[{"role": "user", "content": _PLACEHOLDER}])
        head, found, tail = rendered.prompt.partition(_PLACEHOLDER)
        if not found:
            raise ModelError(
                f"{self.path}'s chat template does not put the user's message in the prompt "
                "as it is; memagent cannot keep the document's text out of its markup."
            )
        bos = not rendered.added_special  # the BOS goes before the first piece of text

        def tokens(text: str, first: bool) -> list[int]:
            if not text:
                return []
            return self._vocab.tokenize(text.encode("utf-8"), add_bos=first, special=True)

        before = tokens(head, bos)
        stop = rendered.stop if isinstance(rendered.stop, list) else [rendered.stop]
        return before, tokens(tail, False), bos and not head, [s for s in stop if s]

    def chat_overhead(self) -> int:
        return len(self._chat_prompt("")[0])

    def describe(self) -> Description:
        from memagent_cli.backends.llama_parts import CHAIN

        path = self.path.resolve()
        return Description(
            model={"path": str(path), "name": self.name, "size": path.stat().st_size},
            engine={
                "backend": "llama",
                "threads": self.threads,
                "gpu_layers": self.gpu_layers,
                "speculate": self.speculate,
                "exact": self.exact,
                "flash_attn": self.flash_attn,
                "cache_type_k": self.cache_type_k,
                "cache_type_v": self.cache_type_v,
                "sampler": CHAIN,  # the order of the sampler chain (vLLM's and SGLang's)
                # This machine, as a calibration's key names it (CPU, GPUs, driver, build):
                # what past readings teach an estimate is of the same machine only.
                "machine": calibration_store.identity(),
            },
        )

    @property
    def calibration(self) -> Calibration | None:
        """The calibration decoding uses: once prepared, the one it read or measured;
        before, the one kept for this engine if any (a trace header is written before the
        weights load), None with --recalibrate or where drafts do not need one."""
        if self._calibration is None and self.speculate and not self.options.recalibrate:
            found = calibration_store.load(self.calibration_key())
            self._calibration = found if found is not None and not found.disputed else None
        return self._calibration

    def readings_at_once(self, most: int) -> int | None:
        """How many of `most` readings pay to read together in one context here, by the
        calibration's costs of the rounds this engine decodes; None where there is none
        (not measured yet, or not at all: no drafts, a recurrent model)."""
        from memagent_cli.backends.calibration import MOST

        found = self.calibration
        if found is None:
            return None
        min_rows = 2 if self.exact else 1  # exact decoding never sends a 1-row round
        if not self.speculate:
            max_rows = min_rows
        elif self.exact:  # drafts only as long as the round sizes proved
            max_rows = max(found.widths, default=min_rows)
        else:
            max_rows = MOST
        return found.readings_at_once(most, min_rows, max_rows, exact=self.exact)

    def markup(self, text: str) -> str | None:
        """None: in this process a document's text is tokenized as text, its spelling of
        a control token included (`_raw`)."""
        return None

    def needs_measuring(self) -> bool:
        """Whether deciding how many readings pay at once needs the weights loaded first:
        drafts here with no calibration kept yet, measured when they load."""
        return self.speculate and self.calibration is None

    def pays_together(self, most: int) -> int:
        """How many of `most` readings pay to read together here (readings_at_once); all
        of them where nothing was measured to say otherwise."""
        if not self.speculate:
            return most  # no calibration: the default of before it, all that fit
        paying = self.readings_at_once(most)
        return most if paying is None else paying  # None: a recurrent model never drafts

    def calibration_record(self) -> str | None:
        """The calibration in one plain value for the trace header; None without one."""
        found = self.calibration
        return None if found is None else found.record()

    def calibration_key(self) -> dict[str, object]:
        """What picks llama.cpp's kernels for this model here (backends/calibration.py): the
        model file, this machine (llama.cpp's build, the CPU, the GPUs and their driver:
        calibration_store.here) and the engine's settings."""
        from memagent_cli.backends import calibration

        return {
            "version": calibration.VERSION,
            "model": calibration_store.model_of(self.path),
            **calibration_store.here(),
            "gpu_layers": self.gpu_layers if can_offload() else 0,
            "threads": self.threads,
            "flash_attn": self.flash_attn,
            "cache_type_k": self.cache_type_k,
            "cache_type_v": self.cache_type_v,
            "ubatch": self.ubatch_size,
            "repack": self.options.repack,
        }

    def calibrate(self, model: object, params: object) -> Calibration:
        """The calibration kept for this model and engine here, or measured now and kept
        (a few seconds, once; again where the readings that followed disputed it). Measured
        under a lock: a second process starting now waits, then reads the one kept."""
        from memagent_cli.backends import calibration, probe

        if self._calibration is not None:
            # Read or measured already (again, with --recalibrate) at an earlier prepare(),
            # or read for a trace header: the weights load again with room for more
            # sequences once the calibration said how many (run/engine.py Engine.together).
            return self._calibration
        key = self.calibration_key()
        recalibrate = self.options.recalibrate
        found = None if recalibrate else calibration_store.load(key, note=ENGINE_NOTES.info)
        if found is not None and not found.disputed:
            return found
        with calibration_store.measuring(key):
            if not recalibrate:  # measured by another process while this one waited?
                again = calibration_store.load(key)
                if again is not None and not again.disputed:
                    return again
                found = again or found
            remeasured = found.remeasured + 1 if found is not None and found.disputed else 0
            tokens = self.tokenize(_calibration_text())
            engine = probe.Engine(model, params, tokens)
            try:
                measured = probe.measure(engine, key, remeasured)
            except (RuntimeError, ValueError) as exc:  # no room for its context, say
                ENGINE_NOTES.info(
                    f"could not measure this model's calibration ({exc}): --exact reads "
                    "without drafts, and a batch row is priced at a fixed cost."
                )
                return calibration.unmeasured(key)
            calibration_store.store(measured, note=ENGINE_NOTES.info)
        return measured

    def check_calibration(self) -> None:
        """Compare the rounds timed so far with what the calibration priced them at: where
        they cost clearly less (it was measured while something else ran), keep it as
        disputed, so that the next reading measures it again, and say so once."""
        engine, found = self._engine, self._calibration
        if engine is None or found is None or self._disputed or found.disputed:
            return
        from memagent_cli.backends.calibration import DISPUTE_SECONDS

        policy = engine.decoder.policy
        decode = policy.fastest(policy.min_rows) or 0.0
        if decode < DISPUTE_SECONDS:
            return  # rounds too short to tell rows from llama.cpp's fixed costs
        why = found.disputed_by(policy.observed(), policy.min_rows, decode)
        if not why:
            return
        self._disputed = True
        if calibration_store.dispute(found, why):
            ENGINE_NOTES.info(
                f"this machine's calibration of {self.name} priced {why}: it is measured "
                "again at the next reading (docs/performance.md, The calibration)"
            )

    def placement(self) -> Placement:
        """Where llama.cpp keeps the weights on the CPU (backends/build.py)."""
        import llama_cpp

        from memagent_cli.backends import build

        info = llama_cpp.llama_print_system_info().decode(errors="replace")
        offload = self.gpu_layers != 0 and can_offload()

        def tensors() -> Iterator[build.Tensor]:  # read only where the rule picks tensors
            yield from build.gguf_tensors(self.path)

        return build.place_weights(info, tensors(), repack=self.options.repack, offload=offload)

    def sequences_that_fit(self, context_tokens: int) -> int:
        """Sequences whose KV caches fit in the memory free now, beside the weights. With
        layers offloaded to a GPU of its own the GPU's free memory is not known here:
        llama.cpp says when a context does not fit."""
        import llama_cpp
        import psutil

        most = int(getattr(llama_cpp, "llama_max_parallel_sequences", lambda: 64)())
        most = min(most, max(1, self.batch_size // 2))  # 2 rows each in a round, in one batch
        # Apple silicon's GPU (Metal) shares the RAM: the same rule as the CPU's there.
        if self.gpu_layers != 0 and can_offload() and sys.platform != "darwin":
            return most
        free = psutil.virtual_memory().available - self.path.stat().st_size - _RESERVE
        return max(1, min(most, free // max(self.cache_bytes(context_tokens), 1)))

    def cache_bytes(self, context_tokens: int) -> int:
        """Bytes of one sequence's KV cache, from the model's shape and the cache types."""
        metadata = self._vocab.metadata
        arch = metadata.get("general.architecture", "")

        def number(key: str, default: int) -> int:
            return int(metadata.get(f"{arch}.{key}", default) or default)

        heads = number("attention.head_count", 1)
        width = number("embedding_length", 0) // heads
        kv_heads = number("attention.head_count_kv", heads)
        k_size = number("attention.key_length", width) * _TYPE_BYTES[self.cache_type_k]
        v_size = number("attention.value_length", width) * _TYPE_BYTES[self.cache_type_v]
        return int(context_tokens * number("block_count", 1) * kv_heads * (k_size + v_size))

    def prepare(
        self, context_tokens: int, sequences: int = 1, progress: Progress | None = None
    ) -> None:
        """Load the weights and a context for `sequences` of `context_tokens` each; the bytes
        of the model loaded so far go to `progress` (a multi-GB model offloaded to a GPU
        takes a while), and Ctrl-C stops the loading."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        self.context_tokens = context_tokens
        self.sequences = sequences
        self._engine = _Loaded(self, context_tokens, sequences, progress)

    @property
    def decoder(self) -> Decoder | None:
        """memagent's decoding loop over the loaded context (None before prepare())."""
        return self._engine.decoder if self._engine is not None else None

    def generate(self, message: str, *, max_tokens: int, sampling: Sampling) -> Generation:
        return _generation(self.decode(message, max_tokens=max_tokens, sampling=sampling))

    def complete(self, raw: Raw, *, max_tokens: int, sampling: Sampling) -> Generation:
        """Continue a prompt a reader wrote whole, chat markup included (backend.Raw)."""
        call = Call("", max_tokens, raw=raw)
        return _generation(self.decode_many([call], sampling=sampling)[0])

    def decode(self, message: str, *, max_tokens: int, sampling: Sampling) -> Decoded:
        """One reply with its whole decoding record: rounds, drafts, time in llama_decode."""
        return self.decode_many([Call(message, max_tokens)], sampling=sampling)[0]

    def decode_many(self, calls: Sequence[Call], *, sampling: Sampling) -> list[Decoded]:
        """Each call's reply with its decoding record, decoded together."""
        decoder = self._decoder()
        decoded = decoder.generate_many([self._request(call, sampling) for call in calls])
        self.check_calibration()
        return decoded

    def next_replies(
        self, calls: Sequence[Call], *, sampling: Sampling
    ) -> list[tuple[int, Generation]]:
        decoder = self._decoder()
        try:
            for call in calls:
                decoder.start(self._request(call, sampling))
            while decoder.in_flight:
                if ended := decoder.step():
                    self.check_calibration()
                    return [(sequence, _generation(decoded)) for sequence, decoded in ended]
        except BaseException:
            decoder.cancel()
            raise
        return []

    def cancel(self) -> None:
        if self._engine is not None:
            self._engine.decoder.cancel()

    def _decoder(self) -> Decoder:
        if self._engine is None:
            raise RuntimeError("prepare() must be called before generate()")
        return self._engine.decoder

    def _request(self, call: Call, sampling: Sampling) -> Request:
        """The call as the decoder takes it: its chat prompt's tokens and stop strings."""
        from memagent_cli.backends.decoding import Request

        if not 0 <= call.sequence < self.sequences:
            raise RuntimeError(f"sequence {call.sequence} of {self.sequences}")
        prompt, stop = self._chat_prompt(call.message) if call.raw is None else self._raw(call.raw)
        if len(prompt) + call.max_tokens > self.context_tokens:
            raise BudgetError(
                f"A call's prompt of {len(prompt):,} tokens and its reply of up to "
                f"{call.max_tokens:,} outgrew the {self.context_tokens:,} tokens of context "
                "sized for this reading (a reader whose prompts grow longer than foreseen); "
                "the trace keeps every finished step."
            )
        return Request(prompt, call.max_tokens, sampling, stop, call.sequence, call.fresh)


def _calibration_text() -> str:
    """Plain sentences for the calibration to decode (any text does: it compares logits)."""
    ships = ("the Heron", "the Gannet", "the Tern", "the Skua", "the Petrel")
    return " ".join(
        f"On day {day} the keeper of the north light counted {3 + day * 7 % 11} boats, "
        f"and {ships[day % 5]} came in before the tide turned."
        for day in range(1, 80)
    )


def _generation(decoded: Decoded) -> Generation:
    return Generation(
        text=decoded.text,
        prompt_tokens=decoded.prompt_tokens,
        completion_tokens=len(decoded.tokens),
        prompt_seconds=decoded.prompt_seconds,
        seconds=decoded.seconds,
        finish_reason=decoded.finish_reason,
        drafted=decoded.drafted,
        accepted=decoded.accepted,
    )


class _Loaded:
    """The weights and one llama.cpp context, driven by memagent's own decoder."""

    def __init__(
        self,
        backend: LlamaCppBackend,
        context_tokens: int,
        sequences: int,
        progress: Progress | None = None,
    ) -> None:
        import llama_cpp

        from memagent_cli.backends.decoding import Decoder
        from memagent_cli.backends.llama_patches import apply

        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = backend.gpu_layers
        self.placement = backend.placement()
        overrides = apply(model_params, self.placement)
        crash.note("weights", self.placement.why)
        if backend.options.verbose:
            sys.stderr.write(f"memagent: weights: {self.placement.why}\n")
        loading = _Loading(progress, f"loading {backend.name}", backend.path.stat().st_size)
        model_params.progress_callback = loading.callback
        self._loading = loading  # llama.cpp holds a pointer to its callback
        self.model = llama_cpp.llama_model_load_from_file(os.fsencode(backend.path), model_params)
        del overrides  # llama.cpp reads the patterns while loading only
        if loading.error is not None:  # Ctrl-C, or a failing callback: loading was cancelled
            if self.model:
                llama_cpp.llama_model_free(self.model)
            raise loading.error
        if not self.model:
            raise ModelError(f"llama.cpp could not load {backend.path}.")
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = context_tokens * sequences  # split evenly between the sequences
        params.n_batch = min(backend.batch_size, context_tokens)
        params.n_ubatch = min(backend.ubatch_size, params.n_batch)
        params.n_seq_max = sequences
        # One KV stream per sequence: each reply sees its cache laid out as it would alone
        # (a shared cache interleaves the sequences' cells and changes near-tie tokens).
        params.kv_unified = False
        params.n_threads = params.n_threads_batch = backend.threads
        params.flash_attn_type = {
            "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
            "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
            "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
        }[backend.flash_attn]
        params.type_k = getattr(llama_cpp, f"GGML_TYPE_{backend.cache_type_k.upper()}")
        params.type_v = getattr(llama_cpp, f"GGML_TYPE_{backend.cache_type_v.upper()}")
        params.no_perf = True
        self.context = llama_cpp.llama_init_from_model(self.model, params)
        if not self.context:
            llama_cpp.llama_model_free(self.model)
            raise ModelError(
                f"llama.cpp could not create a {context_tokens}-token context"
                + (f" for each of {sequences} questions" if sequences > 1 else "")
                + f" for {backend.path} with flash attention {backend.flash_attn}, cache types "
                f"{backend.cache_type_k}/{backend.cache_type_v} (run with --verbose for its log"
                + ("; fewer questions at once: --parallel N" if sequences > 1 else "")
                + ")."
            )
        # Drafts, and an exact round of several sequences, rest on the calibration; a
        # recurrent model's state cannot be cut back, so it never drafts (decoding.py).
        recurrent = llama_cpp.llama_model_is_recurrent(self.model) or (
            llama_cpp.llama_model_is_hybrid(self.model)
        )
        if not recurrent and (backend.speculate or (backend.exact and sequences > 1)):
            try:
                backend._calibration = backend.calibrate(self.model, params)
            except BaseException:  # Ctrl-C while measuring: nothing of this engine stays
                llama_cpp.llama_free(self.context)
                llama_cpp.llama_model_free(self.model)
                raise
        self.decoder = Decoder(
            self.context,
            self.model,
            n_batch=params.n_batch,
            speculate=backend.speculate,
            exact=backend.exact,
            sequences=sequences,
            calibration=backend.calibration,
        )
        proved = backend.calibration.widths if backend.calibration is not None else (1,)
        if backend.exact and backend.speculate and not proved:
            ENGINE_NOTES.info(
                "--exact reads without drafts: on this model and machine no round of "
                "drafts gives the logits of decoding without them (memagent models info)."
            )
        self.close = weakref.finalize(self, _release, self.decoder, self.context, self.model)


class _Loading:
    """llama.cpp's model-load progress callback, as progress(what, bytes, total). An
    exception inside it (Ctrl-C arrives there while llama.cpp loads) cancels the loading
    and is kept, for the caller to raise once llama.cpp has returned."""

    def __init__(self, progress: Progress | None, what: str, total: int) -> None:
        import llama_cpp

        self.error: BaseException | None = None

        @llama_cpp.llama_progress_callback
        def callback(fraction: float, user_data: ctypes.c_void_p) -> bool:
            try:
                if progress is not None:
                    progress(what, int(total * min(max(fraction, 0.0), 1.0)), total)
                return True
            except BaseException as exc:  # a ctypes callback cannot raise: return it
                self.error = exc
                return False

        self.callback = callback  # ctypes keeps only a pointer: hold the function here


def _release(decoder: Decoder, context: object, model: object) -> None:
    import llama_cpp

    decoder.close()
    llama_cpp.llama_free(context)
    llama_cpp.llama_model_free(model)
