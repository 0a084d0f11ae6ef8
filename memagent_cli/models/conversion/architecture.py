"""What llama.cpp needs to know about a Hugging Face model's architecture: its GGUF name,
its hyperparameters as GGUF keys, and its tensors' GGUF names. The reference is llama.cpp's
convert_hf_to_gguf.py (TextModel.set_gguf_parameters and the Qwen2/Qwen3 models).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

from memagent_cli.errors import ModelError

# Hugging Face class -> GGUF architecture. Llama is left out on purpose: its q/k weights need
# a permutation and its tokenizers come in several pre-tokenizer flavours.
SUPPORTED = {
    "Qwen2ForCausalLM": gguf.MODEL_ARCH.QWEN2,
    "Qwen3ForCausalLM": gguf.MODEL_ARCH.QWEN3,
}
_SKIPPED = ("rotary_emb.inv_freq",)  # recomputed by llama.cpp


@dataclass(frozen=True)
class Architecture:
    """A model's config.json, read for conversion."""

    hf_name: str
    arch: gguf.MODEL_ARCH
    config: dict[str, Any]

    @property
    def gguf_name(self) -> str:
        return gguf.MODEL_ARCH_NAMES[self.arch]

    @property
    def layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    def tensor_name(self, hf_name: str) -> str | None:
        """The GGUF name of a tensor; None for one llama.cpp does not need."""
        if hf_name.endswith(_SKIPPED):
            return None
        mapped = _tensor_map(self.arch, self.layers).get_name(
            hf_name, try_suffixes=(".weight", ".bias")
        )
        if mapped is None:
            raise ModelError(
                f"Tensor {hf_name} has no place in a {self.gguf_name} GGUF: this is not a plain "
                f"{self.hf_name} checkpoint."
            )
        return mapped

    def write_parameters(self, writer: gguf.GGUFWriter) -> None:
        """The hyperparameters, as convert_hf_to_gguf.py writes them for this architecture."""
        c = self.config
        writer.add_block_count(self.layers)
        if "max_position_embeddings" in c:
            writer.add_context_length(int(c["max_position_embeddings"]))
        writer.add_embedding_length(int(c["hidden_size"]))
        writer.add_feed_forward_length(int(c["intermediate_size"]))
        writer.add_head_count(int(c["num_attention_heads"]))
        writer.add_head_count_kv(int(c.get("num_key_value_heads", c["num_attention_heads"])))
        rope = self.rope
        if "rope_theta" in rope:
            writer.add_rope_freq_base(float(rope["rope_theta"]))
        writer.add_layer_norm_rms_eps(float(c["rms_norm_eps"]))
        if "head_dim" in c:
            writer.add_key_length(int(c["head_dim"]))
            writer.add_value_length(int(c["head_dim"]))
        kind = rope.get("rope_type", rope.get("type")) or "default"
        if kind == "linear":
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(float(rope["factor"]))
        elif kind == "yarn":
            writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            writer.add_rope_scaling_factor(float(rope["factor"]))
            writer.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
            for key, add in (
                ("extrapolation_factor", writer.add_rope_scaling_yarn_ext_factor),
                ("attention_factor", writer.add_rope_scaling_yarn_attn_factor),
                ("attn_factor", writer.add_rope_scaling_yarn_attn_factor),
                ("beta_fast", writer.add_rope_scaling_yarn_beta_fast),
                ("beta_slow", writer.add_rope_scaling_yarn_beta_slow),
            ):
                if isinstance(rope.get(key), int | float):
                    add(float(rope[key]))

    @property
    def rope(self) -> dict[str, Any]:
        """The rotary embedding's settings, wherever the config keeps them: `rope_theta`
        and `rope_scaling` at the top level (transformers 4), or `rope_parameters`
        (transformers 5), as llama.cpp's converter reads them."""
        c = self.config
        rope = {k: c[k] for k in ("rope_theta", "original_max_position_embeddings") if k in c}
        for key in ("rope_scaling", "rope_parameters"):
            if isinstance(c.get(key), dict):
                rope.update(c[key])
        full = rope.get("full_attention")  # per-layer-type settings: the global layers'
        return {**rope, **full} if isinstance(full, dict) else rope


def read(folder: Path) -> Architecture:
    """The architecture of the model in `folder`; ModelError for one memagent cannot convert."""
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(
            f"{folder} has no config.json: it is not a Hugging Face model folder."
        ) from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ModelError(f"Cannot read {path}: {getattr(exc, 'strerror', None) or exc}.") from None
    names = config.get("architectures") if isinstance(config, dict) else None
    hf_name = names[0] if isinstance(names, list) and names else None
    supported = ", ".join(SUPPORTED)
    if hf_name not in SUPPORTED:
        raise ModelError(
            f"{folder} holds a {hf_name or 'model of unknown architecture'}; memagent converts "
            f"{supported}."
        )
    missing = [
        k
        for k in (
            "num_hidden_layers",
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "rms_norm_eps",
        )
        if not isinstance(config.get(k), int | float)
    ]
    if missing:
        raise ModelError(f"{path} lacks {', '.join(missing)}, which a {hf_name} must have.")
    found = Architecture(hf_name, SUPPORTED[hf_name], config)
    _check_rope(found.rope, path)
    return found


_ROPE_NEEDS = {"linear": ("factor",), "yarn": ("factor", "original_max_position_embeddings")}


def _check_rope(rope: dict[str, Any], path: Path) -> None:
    """Refuse a rotary embedding the GGUF could not describe: llama.cpp would run it as
    plain rope, a model that loads and answers wrongly past its trained context."""
    kind = rope.get("rope_type", rope.get("type")) or "default"
    if kind != "default" and kind not in _ROPE_NEEDS:
        raise ModelError(
            f"{path} asks for {kind} rope scaling; memagent converts default, linear and yarn."
        )
    missing = [k for k in _ROPE_NEEDS.get(kind, ()) if not isinstance(rope.get(k), int | float)]
    if missing:
        raise ModelError(f"{path} asks for {kind} rope scaling without {', '.join(missing)}.")
    theta = rope.get("rope_theta")
    if theta is not None and (not isinstance(theta, int | float) or theta <= 0):
        raise ModelError(f"{path} has a rope_theta of {theta!r}; it must be a positive number.")


_MAPS: dict[tuple[gguf.MODEL_ARCH, int], gguf.TensorNameMap] = {}


def _tensor_map(arch: gguf.MODEL_ARCH, layers: int) -> gguf.TensorNameMap:
    if (arch, layers) not in _MAPS:
        _MAPS[arch, layers] = gguf.get_tensor_name_map(arch, layers)
    return _MAPS[arch, layers]
