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
        if "rope_theta" in c:
            writer.add_rope_freq_base(float(c["rope_theta"]))
        writer.add_layer_norm_rms_eps(float(c["rms_norm_eps"]))
        if "head_dim" in c:
            writer.add_key_length(int(c["head_dim"]))
            writer.add_value_length(int(c["head_dim"]))
        scaling = c.get("rope_scaling") or {}
        if scaling.get("rope_type", scaling.get("type")) == "yarn" and "factor" in scaling:
            writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            writer.add_rope_scaling_factor(float(scaling["factor"]))
            writer.add_rope_scaling_orig_ctx_len(int(scaling["original_max_position_embeddings"]))


def read(folder: Path) -> Architecture:
    """The architecture of the model in `folder`; ModelError for one memagent cannot convert."""
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(
            f"{folder} has no config.json: it is not a Hugging Face model folder."
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
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
    return Architecture(hf_name, SUPPORTED[hf_name], config)


_MAPS: dict[tuple[gguf.MODEL_ARCH, int], gguf.TensorNameMap] = {}


def _tensor_map(arch: gguf.MODEL_ARCH, layers: int) -> gguf.TensorNameMap:
    if (arch, layers) not in _MAPS:
        _MAPS[arch, layers] = gguf.get_tensor_name_map(arch, layers)
    return _MAPS[arch, layers]
