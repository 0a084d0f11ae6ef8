"""The tiny test model's recipe, and where the model under test is.

The fixtures that make and set these models (`tiny_model`, `deep_tiny_model`,
`on_tiny_model`, `model_file`) are tests/conftest.py's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# The property tests' model: Qwen2's shape and real tokenizer and chat template, random
# weights, Q4_1 as the default model, a head size of 32 (llama.cpp's q8_0 KV cache needs a
# multiple of 32). Properties hold for any model, so none of them needs trained weights.
TINY_SIZES = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
TINY_SEED = 7
# A random model rarely ends a reply, so every final answer would run to the protocol's 1,024
# tokens. A longer <|im_end|> row in the (tied) embeddings makes it end most replies after
# 10-60 tokens (measured on a few MemAgent prompts): short calls, and both finish reasons.
TINY_EOS_SCALE = 2.6

# The tiny model with 24 layers for the negative control (tests/test_speculation.py): on 2
# layers llama.cpp's single-row and batched kernels give the same logits (bench/widths.py),
# on 24 the small differences grow until some tokens change, as they do in a trained model.
DEEP_TINY_LAYERS = 24


def build_tiny(folder: Path, out: Path, layers: int | None = None) -> Path:
    """Write the tiny model's Hugging Face folder at `folder` and convert it to Q4_1 at
    `out` with memagent's own converter (under a second; 24 layers: 28 MB, about a second)."""
    from memagent_cli.models.conversion import convert
    from support import hf_model

    sizes = TINY_SIZES if layers is None else TINY_SIZES | {"num_hidden_layers": layers}
    eos = {("model.embed_tokens.weight", hf_model.EOS): TINY_EOS_SCALE}
    hf_model.build(folder, sizes=sizes, seed=TINY_SEED, scale_rows=eos)
    return convert.convert(folder, out, "Q4_1")


def default_model_path() -> Path:
    """The model under test: the tiny one where the test asked for it (`on_tiny_model`),
    else the default model."""
    from memagent_cli import models

    return models.resolve(None).path


def real_model_path() -> Path:
    """The real default model (SmolLM2-135M), whatever $MEMAGENT_MODEL says."""
    from memagent_cli.models import registry

    found = registry.find_file(registry.default_name() or "")
    assert found is not None, "the default model is not installed: make install"
    return found


# A test (or module fixture) parametrized by this runs on the tiny model in `make test` and
# on the real default model in `make test-real`.
BOTH_MODELS = ["tiny", pytest.param("real", marks=pytest.mark.real_model)]
