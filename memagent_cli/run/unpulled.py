"""`inspect` for a registry model not pulled yet: what one question will take on this machine,
and the download and conversion before it, without downloading anything.

- Tokens are counted with tiktoken (approximate for the model's own tokenizer).
- Its speed is its layer shapes' on this machine: a stand-in with the model's hidden size,
  heads, FFN size and quantization's tensor types, models/shaped.py's LAYERS deep with random
  weights, is timed at a step's depth as `inspect` times a model (backends/speed.py), and its
  rates scaled to the model: prefill (compute-bound, the stand-in's output matrix read once
  per batch) and the cost of depth (attention, per layer) by the layers; decoding
  (memory-bound: every weight read once per token) by the weights read per token, the
  layers' and the output matrix's. Kept per model and machine as any speed is
  (backends/speeds_store.py): a second look takes a moment.
- How long its replies run and what drafts save cannot be measured without it: as a first
  reading of any model is priced (run/inspect.py FIRST_GUESS, a range to the bound).
- The download at a stated rate; conversion at the rates measured converting a small model
  (CONVERT_RATE, QUANTIZE_RATE), scaled by the parameters and this machine's cores.
"""

from __future__ import annotations

import dataclasses
import gc
import tempfile
from pathlib import Path
from typing import Any

from memagent_cli import cpus
from memagent_cli.backends import speed as speeds
from memagent_cli.backends import speeds_store
from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions
from memagent_cli.backends.speed import Speed
from memagent_cli.backends.tokenizers import DEFAULT_ENCODING, TiktokenTokenizer
from memagent_cli.documents.document import Document
from memagent_cli.errors import ModelError
from memagent_cli.files import private_folder
from memagent_cli.folders import cache_dir
from memagent_cli.models import hub, registry, shaped
from memagent_cli.models.shaped import Shape
from memagent_cli.progress import SILENT, Reporter
from memagent_cli.reader import Settings
from memagent_cli.run.history import History
from memagent_cli.run.inspect import MEASURE_BUDGET, estimate_reading, inspect_document
from memagent_cli.run.session import cut

# Bytes a second a download is priced at: stated, not measured (200 Mbit/s).
DOWNLOAD_RATE = 25e6
# Converting Hugging Face weights and quantizing them, as measured converting a 0.63B
# model on a 2-core Xeon VM (bench/results/2026-11-27-xeon-amx/convert-1.json): safetensors
# to the BF16 intermediate at 217M parameters a second (disk-bound), and that quantized to
# Q4_K_M at 46M a second on 2 cores (the quantizer uses every core).
CONVERT_RATE = 217e6
QUANTIZE_RATE = 23e6  # per core


def not_pulled(model: str | None) -> tuple[str, dict[str, Any]] | None:
    """The registry entry `model` names (a --model value) when it has a shape and is not
    pulled yet; else None (a file, a pulled model, a Hub repository)."""
    if not model:
        return None
    entry = registry.registry().get(model)
    if entry is None or not entry.get("hf") or entry.get("shape") is None:
        return None
    if registry.find_file(model) is not None:
        return None
    return model, entry


def inspect_unpulled(
    document: Document,
    name: str,
    entry: dict[str, Any],
    settings: Settings,
    llama: LlamaOptions,
    *,
    estimate: bool = True,
    report: Reporter = SILENT,
) -> dict[str, Any]:
    """What `inspect` reports on `document` for the registry model `name` before it is
    pulled: the document, its tokens (tiktoken) and chunks, the pull (`pull`: download and
    conversion) and, with `estimate`, a question's time on this machine."""
    found = inspect_document(
        document,
        backend=None,
        encoding=DEFAULT_ENCODING,
        chunk_tokens=settings.chunk_tokens,
        memory_tokens=settings.memory_tokens,
        estimate=False,
        reader=settings.reader,
        report=report,
    )
    shape = Shape.of(name, entry)
    assert shape is not None  # not_pulled() found one
    quant = hub.parse(str(entry["hf"])).quant
    found["tokenizer"]["stands_for"] = name
    found["pull"] = pull_cost(entry, shape, quant)
    if estimate and found["chunks"]:
        found["estimate"] = _estimate(document, name, shape, quant, settings, llama, report)
    return found


def pull_cost(entry: dict[str, Any], shape: Shape, quant: str) -> dict[str, Any]:
    """The download at DOWNLOAD_RATE and, for weights converted after it, the conversion
    and quantization on this machine's cores."""
    size = int(entry.get("download") or 0)
    cores = cpus.usable()
    converted = bool(entry.get("converted"))
    seconds = 0.0
    if converted:
        seconds = shape.parameters / CONVERT_RATE + shape.parameters / (QUANTIZE_RATE * cores)
    return {
        "download_bytes": size,
        "download_seconds": round(size / DOWNLOAD_RATE, 1),
        "download_rate": DOWNLOAD_RATE,
        "converted": converted,
        "quant": quant,
        "conversion_seconds": round(seconds, 1) if converted else None,
        "cores": cores,
        "parameters": shape.parameters,
        "assumes": (
            f"a download at {DOWNLOAD_RATE / 1e6:.0f} MB/s (a stated rate, not measured)"
            + (
                f"; converting at {CONVERT_RATE / 1e6:.0f}M parameters a second and "
                f"quantizing to {quant} at {QUANTIZE_RATE / 1e6:.0f}M a second per core, as "
                "a 0.6B model converted on a 2-core VM (a slower disk takes longer)"
                if converted
                else ""
            )
        ),
    }


def stand_in_key(backend: LlamaCppBackend, name: str, shape: Shape, quant: str) -> dict[str, Any]:
    """The key a stand-in's scaled speed is kept under: `backend`'s engine here (any model
    file of it: the file is replaced by the registry name, shape and quantization)."""
    model = {"registry": name, "quant": quant, "shape": dataclasses.asdict(shape)}
    key = backend.calibration_key() | {"model": model}
    return speeds_store.key_for(key, batch=backend.batch_size, exact=backend.exact)


def kept_stand_in(backend: LlamaCppBackend) -> speeds_store.Kept | None:
    """The speed a stand-in of `backend`'s registry model was timed at here before it was
    pulled, if any (its name, as the registry names it)."""
    entry = registry.registry().get(backend.name)
    if entry is None or not entry.get("hf"):
        return None
    try:
        shape = Shape.of(backend.name, entry)
    except ValueError:
        return None
    if shape is None:
        return None
    quant = hub.parse(str(entry["hf"])).quant
    return speeds_store.load(stand_in_key(backend, backend.name, shape, quant))


def scaled(speed: Speed, stand_in: Shape, model: Shape) -> Speed:
    """The rates of `model` from those of its `stand_in` (the same layer shapes, fewer
    layers, another vocabulary): a prompt token and the depth's cost by the layers, a
    decoded token by the weights it reads (the layers' and the output matrix's)."""
    layers = model.layers / stand_in.layers

    def read(shape: Shape) -> int:
        return shape.layers * shape.layer_weights() + shape.output_weights()

    weights = read(model) / read(stand_in)
    return dataclasses.replace(
        speed,
        prefill_base=speed.prefill_base * layers,
        prefill_slope=speed.prefill_slope * layers,
        decode_base=speed.decode_base * weights,
        decode_slope=speed.decode_slope * layers,
    )


def _estimate(
    document: Document,
    name: str,
    shape: Shape,
    quant: str,
    settings: Settings,
    llama: LlamaOptions,
    report: Reporter,
) -> dict[str, Any]:
    """A question's time on this machine for the model not pulled, its stand-in's speed
    timed (or kept) and scaled; the prompts sized with the default model's tokenizer and
    chat template, tokens counted with tiktoken."""
    default = registry.find_file(registry.default_name())
    if default is None:
        return {"error": "the default model is not installed: it lends the stand-in its tokenizer"}
    stand = LlamaCppBackend(default, llama, name=name)  # its vocabulary only, for the prompts
    stand.context_limit = shape.context
    _, chunks = cut(document, TiktokenTokenizer(DEFAULT_ENCODING), settings.chunk_tokens)
    kept_as = stand_in_key(stand, name, shape, quant)

    def measure(backend: LlamaCppBackend, sample: list[int], depth: int) -> Speed:
        folder = cache_dir() / "stand-ins"
        private_folder(folder)
        with tempfile.TemporaryDirectory(dir=folder) as made:
            path = Path(made) / f"{name}-stand-in.gguf"
            report.note(
                f"{name} is not pulled: timing its layer shapes here in a "
                f"{shaped.LAYERS}-layer stand-in with random {quant} weights (nothing is "
                "downloaded)..."
            )
            own = shaped.write(shape, quant, default, path)
            # Drafts need no calibration to time single decodes; nothing is kept of it.
            options = dataclasses.replace(llama, speculate=False, recalibrate=False)
            timed = LlamaCppBackend(path, options, name=f"{name} stand-in")
            with report.progress("bytes") as progress:
                timed.prepare(depth + 64, progress=progress)
            speed = speeds.measure(timed, sample, depth, budget=MEASURE_BUDGET)
            del timed
            gc.collect()  # its weights unmapped before the file goes
        return scaled(speed, own, shape)

    try:
        found = estimate_reading(
            stand, chunks, settings, report, measure=measure, past=History(), kept_as=kept_as
        )
    except (OSError, ValueError) as exc:
        raise ModelError(f"Could not time a stand-in of {name} here: {exc}.") from None
    if "error" not in found:
        found["assumes"] += (
            f"; {name} is not pulled: its rates are those of its layer shapes timed here in a "
            f"{shaped.LAYERS}-layer stand-in with random {quant} weights, scaled to its "
            f"{shape.layers} layers and {shape.vocab:,}-token output; tokens counted with "
            f"tiktoken {DEFAULT_ENCODING}, approximate for its tokenizer"
        )
        found["stand_in"] = True
    return found
