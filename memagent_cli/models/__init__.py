"""Getting a model: models on this machine (local.py), the registry (registry.py), GGUF
headers (gguf.py), the Hugging Face Hub (hub.py), pulling (pulling.py) and converting
Hugging Face weights (conversion/)."""

from memagent_cli.models.local import ENV_VAR, Listed, catalogue, describe, model_reader, resolve
from memagent_cli.models.pulling import convert, pull
from memagent_cli.models.registry import Model

__all__ = [
    "ENV_VAR",
    "Listed",
    "Model",
    "catalogue",
    "convert",
    "describe",
    "model_reader",
    "pull",
    "resolve",
]
