"""Backends: how tokens are produced, in this process (llama.cpp) or by a server."""
