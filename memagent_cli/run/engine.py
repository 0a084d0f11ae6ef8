"""A model ready to read: the backend a user asked for (an in-process GGUF model or a
server), opened with its options, and the settings and context it reads by (`Engine`)."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from memagent_cli import protocol, readers
from memagent_cli.backend import Backend
from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions, can_offload
from memagent_cli.backends.openai import OpenAIBackend, ServerOptions
from memagent_cli.errors import BudgetError
from memagent_cli.models import gguf, model_reader, resolve
from memagent_cli.progress import Note, Progress, silent
from memagent_cli.reader import Settings


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


# What a reader's authors chose, which a reading takes where no one gave a value: sampling,
# and how long a memory update's reply may run.
AUTHORS_SAMPLING = ("temperature", "top_p")
READER_DEFAULTS = (*AUTHORS_SAMPLING, "memory_tokens")


@dataclass(frozen=True)
class ReadOptions:
    """How a command reads, as its flags say (cli/options.py) or a caller of the API does:
    the backend and its model, the reader (None: the model's own), the settings of each
    reading, and how many readings go at once. Of the settings' sampling, only the values
    named in `given` are the caller's, and of `memory_tokens` likewise: the others are the
    reader's authors' (reading_settings)."""

    backend: BackendOptions = field(default_factory=BackendOptions)
    settings: Settings = field(default_factory=Settings)
    # --parallel: readings at once, in one context or in flight to a server; None: not
    # given, which run/batch.py's readings_at_once decides.
    parallel: int | None = None
    reader: str | None = None
    given: frozenset[str] = frozenset()


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


def open_model(
    options: ReadOptions, note: Note = silent, progress: Progress | None = None
) -> tuple[Backend, Settings]:
    """The backend `options` name and the settings it reads by: the reader given, else the
    model's own, sampled as its authors did wherever the caller gave no value."""
    backend = open_backend(options.backend, note, progress)
    return backend, reading_settings(backend, options, note)


def reading_settings(backend: Backend, options: ReadOptions, note: Note = silent) -> Settings:
    """`options.settings` read by `options.reader`, else the reader `backend`'s model was
    trained for; each sampling value, and the memory's reply limit, not in `options.given`
    as that reader's authors chose it, which `note` hears of where that is not what the
    settings held."""
    name = options.reader or _model_reader(backend, options.backend.model, note)
    spec = readers.get(name)
    held = options.settings
    unsaid = [key for key in AUTHORS_SAMPLING if key not in options.given]
    sampling = dataclasses.replace(
        held.sampling, **{key: getattr(spec.sampling, key) for key in unsaid}
    )
    if sampling != held.sampling:
        said = ", ".join(f"{key} {getattr(spec.sampling, key):g}" for key in unsaid)
        note(f"{name} samples as its authors did: {said} (--temperature, --top-p to change).")
    memory = held.memory_tokens
    if "memory_tokens" not in options.given and memory != spec.memory_tokens:
        memory = spec.memory_tokens
        note(
            f"{name} replies as its authors allowed: {memory} tokens a memory "
            "(--memory-tokens to change)."
        )
    return dataclasses.replace(held, reader=name, sampling=sampling, memory_tokens=memory)


def _model_reader(backend: Backend, named: str | None, note: Note) -> str:
    """The reader the model was trained for (models.model_reader), the model as the user
    `named` it (--model, which also names a server's model) or as the backend does;
    MemAgent's for a model file that records none, said once."""
    path = backend.describe().model.get("path")
    found = model_reader(named or backend.name, Path(path) if path else None)
    if found is not None:
        return found
    if path and Path(path).is_file():
        note(
            f"{Path(path).name} does not say which reader it was trained for: it reads with "
            f"{readers.DEFAULT} (--reader to choose another)."
        )
    return readers.DEFAULT


class Engine:
    """A backend with the settings it reads by and the context one step needs."""

    def __init__(self, backend: Backend, settings: Settings, context: int) -> None:
        self.backend = backend
        self.settings = settings
        self.context = context
        self.description = backend.describe()
        self._sequences = 0  # questions the loaded context reads at once; 0: not loaded
        self.questions: list[str] = []  # the questions its context was sized for
        self._lock = threading.Lock()

    def prepare(self, sequences: int = 1, progress: Progress | None = None) -> None:
        """Load the weights on first use (answers from traces never need them), with room
        for `sequences` questions read together, each with the context one step needs;
        `progress` hears of the bytes loaded."""
        with self._lock:
            if self._sequences < sequences:
                self.backend.prepare(self.context, sequences, progress)
                self._sequences = sequences

    @classmethod
    def for_questions(cls, backend: Backend, settings: Settings, questions: list[str]) -> Engine:
        """`backend` with its context sized for one call of the longest of `questions`;
        fails with a sentence when one cannot fit."""
        spec = readers.get(settings.reader)
        engine = cls(backend, settings, spec.context_needed(backend, questions, settings))
        engine.questions = list(questions)
        return engine

    def fit(self, steps: int) -> None:
        """Room for a document of `steps` chunks, where the reader's calls grow with it
        (Spec.grows): a larger context, loaded at the next `prepare`; a sentence where the
        model cannot hold it."""
        spec = readers.get(self.settings.reader)
        if spec.grows is None or not self.questions:
            return
        needed = spec.context_needed(self.backend, self.questions, self.settings, steps)
        with self._lock:
            if needed > self.context:
                self.context, self._sequences = needed, 0

    @property
    def threaded(self) -> bool:
        """Whether readings at once are calls in flight from threads (Backend.threaded)."""
        return self.backend.threaded

    def together(
        self,
        questions: int,
        asked: int | None,
        progress: Progress | None = None,
        note: Note = silent,
        what: str = "readings",
        calls: int = 1,
    ) -> int:
        """How many of `questions` to read at once: `asked` (--parallel) when that many fit
        in memory, else (None) as many as fit and pay, by this model's calibration here.
        Fails with a sentence when `asked` does not fit. `note` hears, in one line, when the
        calibration reads fewer at once than fit; `what` names the readings in it ("the 3
        documents"); `progress` hears of the weights loaded to measure the calibration.
        `calls`: the prompts each reading asks at once (Spec.at_once), each a sequence of its
        own where they fit and pay: then the number is of sequences, not readings."""
        fits = self.backend.sequences_that_fit(self.context)
        wanted = min(questions * calls, fits if asked is None else asked)
        if wanted > fits:
            at_once = "questions read" if calls == 1 else "calls"
            raise BudgetError(
                f"{wanted} {at_once} at once need {wanted} context caches of "
                f"{self.context} tokens, but only {fits} fit in the memory free now; "
                f"use --parallel {fits}."
            )
        if asked is not None or wanted <= 1:
            return max(1, wanted)
        paying = self._paying(wanted, progress)
        if paying < wanted:
            how = "one at a time" if paying == 1 else f"{paying} at a time"
            what = what if calls == 1 else "the calls a reading asks at once"
            note(
                f"reading {what} {how}: on this machine a batch costs about as much as its "
                "rows read apart (calibration; --parallel N to read together)"
            )
        return paying

    def _paying(self, most: int, progress: Progress | None) -> int:
        """How many of `most` readings pay to read together in one context: all of them
        where nothing was measured to say otherwise (a server's calls, or no calibration)."""
        if self.backend.needs_measuring():
            # A first use on this machine: measure first. The calibration needs the weights
            # loaded, so they load for one reading and measure (a few seconds, once); they
            # load again only where the calibration says that more at once pay. Reading all
            # at once unmeasured would cost the first batch 8-10% where a batch does not
            # pay (docs/performance.md, Several documents at once).
            self.prepare(1, progress)
        return self.backend.pays_together(most)

    def _answer_record(self) -> dict[str, int]:
        """The answer's reply limit, where the reader's is not MemAgent's 1024."""
        spec = readers.get(self.settings.reader)
        answer = spec.replies(self.settings.memory_tokens).answer
        return {} if answer == protocol.FINAL_MAX_TOKENS else {"answer_tokens": answer}

    @property
    def model_record(self) -> dict[str, Any]:
        return self.description.model

    def settings_record(self) -> dict[str, Any]:
        sampling = self.settings.sampling
        calibration = self.backend.calibration_record()
        return {
            "chunk_tokens": self.settings.chunk_tokens,
            "memory_tokens": self.settings.memory_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed,
            # MemAgent's runs say nothing, so traces from before the readers are the same run.
            **readers.recorded(self.settings.reader),
            **self._answer_record(),
            "context_tokens": self.context,
            **self.description.engine,
            # What drafts may do here, measured once per model and machine: one plain value.
            **({"calibration": calibration} if calibration is not None else {}),
        }
