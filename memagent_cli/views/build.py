"""`memagent --version`: memagent's version and what its llama.cpp build is, on stdout."""

from __future__ import annotations

import json
from typing import Any

from memagent_cli import __version__


def show(info: dict[str, Any], *, as_json: bool) -> None:
    """Print the build: a few lines, or one JSON object for bug reports."""
    if as_json:
        print(json.dumps({"memagent": __version__, **info}, indent=2))
        return
    for line in lines(info):
        print(line)


def lines(info: dict[str, Any]) -> list[str]:
    """The build in a few lines, as llama-cli --version and its system info say it."""
    if "llama_cpp" in info:  # its library cannot load: why, in one line
        return [f"memagent {__version__}", f"llama.cpp {info['llama_cpp']}"]
    features = [name for name, on in info["cpu_features"].items() if on]
    if info["repack"]:
        features.append("REPACK")
    gpus = [d for d in info["devices"] if d["kind"] != "CPU"]
    offload = "yes" if info["gpu_offload"] else "no (a CPU build; docs/install.md builds for a GPU)"
    found = [
        f"memagent {__version__}",
        f"llama-cpp-python {info['llama_cpp_python']}, ggml {info['ggml']} ({info['ggml_commit']})",
        f"CPU features: {' '.join(features) or 'none'}",
        f"weights: {info['weights']}",
        f"GPU offload: {offload}",
    ]
    for device in info["devices"]:
        memory = f", {device['free'] / 2**30:.1f} of {device['total'] / 2**30:.1f} GiB free"
        found.append(f"device {device['name']} ({device['kind']}): {device['description']}{memory}")
    if info["gpu_offload"] and not gpus:
        found.append("no GPU found: layers stay on the CPU")
    return found
