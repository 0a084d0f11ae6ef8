"""Backends: how tokens are produced, in this process (llama.cpp) or by a server.

Importing this package makes the C++ runtime global before any llama.cpp library loads
(backends/llama_patches.py `cxx_runtime_first`, docs/troubleshooting.md): everything in this
package imports llama_cpp after this has run.
"""

from memagent_cli.backends.llama_patches import cxx_runtime_first

cxx_runtime_first()
