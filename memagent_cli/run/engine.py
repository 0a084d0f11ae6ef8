"""A model ready to read: the backend a user asked for (an in-process GGUF model or a
server), opened with its options, and the settings and context it reads by (`Engine`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from memagent_cli.backend import Backend
from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions, can_offload
from memagent_cli.backends.openai import OpenAIBackend, ServerOptions
from memagent_cli.errors import BudgetError
from memagent_cli.models import gguf, resolve
from memagent_cli.progress import Note, Progress, silent
from memagent_cli.reader import Settings
from memagent_cli.readers import DEFAULT, context_needed


class BackendKind(StrEnum):
    """Where tokens come from."""

    llama = "llama"  # a GGUF model in this process
    openai = "openai"  # an OpenAI-compatible server


@dataclass(frozen=True)
class BackendOptions:
    """Which backend, its model, and that backend's own options."""

    kind: BackendKind = BackendKind.llama
    model: str | None = None  # --model: a path, registry name or hf: spec
    llama: LlamaOptions = field(default_factory=LlamaOptions)
    server: ServerOptions = field(default_factory=ServerOptions)


@dataclass(frozen=True)
class ReadOptions:
    """How a command reads, as its engine flags say (cli/options.py): the backend and its
    model, the settings of each reading, and how many readings go at once."""

    backend: BackendOptions = field(default_factory=BackendOptions)
    settings: Settings = field(default_factory=Settings)
    # --parallel: readings at once, in one context or in flight to a server (run/batch.py,
    # Engine.threaded); None: not given, which each command decides.
    parallel: int | None = None


def open_backend(
    options: BackendOptions, note: Note = silent, progress: Progress | None = None
) -> Backend:
    """The backend `options` name, its vocabulary ready; a model's weights load later, when
    the run calls `prepare`. An `hf:` model not pulled yet is pulled first, told through
    `note` and `progress(what, done, total)`."""
    if options.kind == BackendKind.openai:
        return OpenAIBackend(options.server, note=note)
    found = resolve(options.model, note=note, progress=progress)
    gguf.read(found.path)  # a damaged or hostile header: one sentence, before llama.cpp
    backend = LlamaCppBackend(found.path, options.llama, name=found.name)
    if backend.exact and backend.gpu_layers != 0 and can_offload():
        note(
            "warning: --exact is byte-exact on the CPU only for now: with layers on a GPU, "
            "a draft or another reading in the same round can still change a near-tie "
            "token (docs/performance.md, On a GPU); --gpu-layers 0 keeps the promise."
        )
    return backend


class Engine:
    """A backend with the settings it reads by and the context one step needs."""

    def __init__(self, backend: Backend, settings: Settings, context: int) -> None:
        self.backend = backend
        self.settings = settings
        self.context = context
        self.description = backend.describe()
        self._sequences = 0  # questions the loaded context reads at once; 0: not loaded
        self._lock = threading.Lock()

    def prepare(self, sequences: int = 1, progress: Progress | None = None) -> None:
        """Load the weights on first use (answers from traces never need them), with room
        for `sequences` questions read together, each with the context one step needs;
        `progress` hears of the bytes loaded."""
        with self._lock:
            if self._sequences < sequences:
                self.backend.prepare(self.context, sequences, progress)
                self._sequences = sequences

    @property
    def threaded(self) -> bool:
        """Whether readings at once are calls in flight from threads (a server, which
        replies to each call on its own), rather than sequences of one context."""
        return isinstance(self.backend, OpenAIBackend)

    def together(
        self,
        questions: int,
        asked: int | None,
        progress: Progress | None = None,
        note: Note = silent,
        what: str = "readings",
    ) -> int:
        """How many of `questions` to read at once: `asked` (--parallel) when that many fit
        in memory, else (None) as many as fit and pay, by this model's calibration here.
        Fails with a sentence when `asked` does not fit. `note` hears, in one line, when the
        calibration reads fewer at once than fit; `what` names the readings in it ("the 3
        documents"); `progress` hears of the weights loaded to measure the calibration."""
        fits = self.backend.sequences_that_fit(self.context)
        wanted = min(questions, fits if asked is None else asked)
        if wanted > fits:
            raise BudgetError(
                f"{wanted} questions read at once need {wanted} context caches of "
                f"{self.context} tokens, but only {fits} fit in the memory free now; "
                f"use --parallel {fits}."
            )
        if asked is not None or wanted <= 1:
            return max(1, wanted)
        paying = self._paying(wanted, progress)
        if paying < wanted:
            how = "one at a time" if paying == 1 else f"{paying} at a time"
            note(
                f"reading {what} {how}: on this machine a batch costs about as much as its "
                "rows read apart (calibration; --parallel N to read together)"
            )
        return paying

    def _paying(self, most: int, progress: Progress | None) -> int:
        """How many of `most` readings pay to read together in one context: all of them
        where nothing was measured to say otherwise (a server's calls, or no calibration)."""
        backend = self.backend
        if not isinstance(backend, LlamaCppBackend) or not backend.speculate:
            return most  # no calibration: the default of before it, all that fit
        if backend.calibration is None:
            # A first use on this machine: measure first. The calibration needs the weights
            # loaded, so they load for one reading and measure (a few seconds, once); they
            # load again only where the calibration says that more at once pay. Reading all
            # at once unmeasured would cost the first batch 8-10% where a batch does not
            # pay (docs/performance.md, Several documents at once).
            self.prepare(1, progress)
        paying = backend.readings_at_once(most)
        return most if paying is None else paying  # None: a recurrent model never drafts

    @property
    def model_record(self) -> dict[str, Any]:
        return self.description.model

    def settings_record(self) -> dict[str, Any]:
        sampling = self.settings.sampling
        calibration = getattr(self.backend, "calibration", None)
        return {
            "chunk_tokens": self.settings.chunk_tokens,
            "memory_tokens": self.settings.memory_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed,
            # MemAgent's runs say nothing, so traces from before the readers are the same run.
            **({"reader": self.settings.reader} if self.settings.reader != DEFAULT else {}),
            "context_tokens": self.context,
            **self.description.engine,
            # What drafts may do here, measured once per model and machine: one plain value.
            **({"calibration": calibration.record()} if calibration is not None else {}),
        }


def open_engine(
    options: BackendOptions,
    settings: Settings,
    questions: list[str],
    note: Note = silent,
    progress: Progress | None = None,
) -> Engine:
    """The backend, with its context sized for the longest question; fails with a sentence
    when one step cannot fit. `note` and `progress` tell of a model being pulled."""
    backend = open_backend(options, note, progress)
    return Engine(backend, settings, context_needed(backend, questions, settings))
