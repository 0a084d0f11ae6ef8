"""An OpenAI-compatible server (llama.cpp's llama-server, vLLM, SGLang, Ollama, or
llama-cpp-python's server): the same protocol over `/v1/chat/completions`.

Its parts: `backend` (the Backend: the served model, its context, completions), `tokens`
(the server's tokenize endpoint, else tiktoken), `client` (one JSON request: retries,
bounds, one sentence per failure), `deadline` (connections that keep a call's deadline),
`urls` (credentials never shown, a key only where it belongs, traffic in the clear).
"""

from memagent_cli.backends.openai.backend import MOST_TIMEOUT, OpenAIBackend, ServerOptions
from memagent_cli.backends.openai.client import MOST_REPLY_BYTES, BackendError, retry_after
from memagent_cli.backends.openai.urls import in_the_clear, openai_api_key, without_credentials

__all__ = [
    "MOST_REPLY_BYTES",
    "MOST_TIMEOUT",
    "BackendError",
    "OpenAIBackend",
    "ServerOptions",
    "in_the_clear",
    "openai_api_key",
    "retry_after",
    "without_credentials",
]
