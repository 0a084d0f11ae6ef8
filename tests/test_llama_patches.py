"""What memagent changes in llama.cpp and llama-cpp-python where they offer no supported
route (backends/llama_patches.py): each is undone when done, and each was checked against
llama-cpp-python 0.3.36 and the llama.cpp it vendors. No model's weights are loaded:
llama.cpp's log is made by asking it to open a file that is not there, and detokenizing
needs the tiny model's vocabulary only."""

from __future__ import annotations

import ctypes

import llama_cpp
import llama_cpp.llama_cpp as library
import pytest

from memagent_cli.backends.build import Placement
from memagent_cli.backends.llama_patches import (
    CHECKED_WITH,
    LlamaLog,
    placed_weights,
    whole_pieces,
)


def test_the_patches_were_checked_against_this_llama_cpp_python():
    # A new version: read each patch of backends/llama_patches.py against it (the struct
    # llama_model_tensor_buft_override, llama_model_default_params as Llama calls it,
    # llama_log_get/set, LlamaModel.detokenize, and docs/troubleshooting.md's libstdc++
    # crash), then move this.
    assert llama_cpp.__version__ == CHECKED_WITH == "0.3.36"


def current_log() -> int | None:
    callback, data = llama_cpp.llama_log_callback(), ctypes.c_void_p()
    llama_cpp.llama_log_get(ctypes.byref(callback), ctypes.byref(data))
    return ctypes.cast(callback, ctypes.c_void_p).value


def open_missing(name: str) -> None:
    """A load that fails: llama.cpp logs why, with the file's name."""
    params = llama_cpp.llama_model_default_params()
    assert not llama_cpp.llama_model_load_from_file(f"/nowhere/{name}".encode(), params)


def test_llama_cpps_log_goes_to_stderr_printable_or_nowhere_and_is_put_back(capsys):
    before = current_log()
    verbose = LlamaLog(verbose=True)
    assert current_log() != before
    open_missing("\x1b]52;c;Y2xpcA==\x07evil.gguf")  # a name that would set the clipboard
    said = capsys.readouterr().err
    assert "error loading model" in said and "evil.gguf" in said
    assert "\x1b" not in said and "\x07" not in said

    quiet = LlamaLog(verbose=False)  # a later one wins, and puts back the one before it
    open_missing("quiet.gguf")
    assert capsys.readouterr().err == ""
    quiet.restore()
    open_missing("loud.gguf")
    assert "loud.gguf" in capsys.readouterr().err
    verbose.restore()
    assert current_log() == before


@pytest.mark.parametrize("extra_buffers", [False, True])
def test_llamas_own_loads_get_the_placement_only_inside_the_context(extra_buffers):
    default = library.llama_model_default_params
    assert default().use_extra_bufts  # llama.cpp's own default
    placement = Placement(extra_buffers, why="a test")
    with placed_weights(placement) as placed:
        assert placed is placement
        assert library.llama_model_default_params().use_extra_bufts is extra_buffers
        with placed_weights(Placement(True, why="nested")):
            assert library.llama_model_default_params().use_extra_bufts
        assert library.llama_model_default_params().use_extra_bufts is extra_buffers
    assert library.llama_model_default_params is default


def test_the_placement_is_undone_when_the_load_fails():
    default = library.llama_model_default_params
    with pytest.raises(ValueError), placed_weights(Placement(False, why="a test")):
        llama_cpp.Llama(model_path="/nowhere/model.gguf", verbose=False)
    assert library.llama_model_default_params is default


@pytest.mark.model
def test_llamas_own_detokenize_gives_long_tokens_inside_the_context(tiny_model):
    llm = llama_cpp.Llama(model_path=str(tiny_model), vocab_only=True, verbose=False)
    rule = b"=" * 80 + b"\n" + b" " * 40 + b"x"
    tokens = llm.tokenize(rule, add_bos=False, special=False)
    assert llm.detokenize(tokens) != rule  # llama-cpp-python's own: long tokens dropped
    with whole_pieces():
        assert llm.detokenize(tokens) == rule
        assert llm.tokenizer().decode(tokens) == rule.decode()
        im_end = llm.tokenize(b"<|im_end|>", add_bos=False, special=True)
        assert llm.detokenize(im_end) == b"" and llm.detokenize(im_end, special=True)
    assert llm.detokenize(tokens) != rule
