"""memagent's converter against llama.cpp's on a real model, Qwen2.5-Coder-0.5B-Instruct
(tests/support/qwen_material.py): the GGUF that llama.cpp's converter wrote is the reference, and
memagent converts the Hugging Face folder that GGUF came from. They must agree: every
metadata key llama.cpp wrote, every tensor after the same rounding, the tokens of varied
texts, the logits.

The shipped GGUF is Q4_K_M, so llama.cpp's own quantizer takes it back to BF16 and F16 for
the comparisons of tensors and logits: the folder's weights are those values rounded to
bf16 (norms and biases float32), which is what llama.cpp's converter writes for bf16
weights. One conversion per type, shared by the module. Run under the llama.cpp lock."""

from __future__ import annotations

import ctypes
from pathlib import Path

import gguf
import numpy as np
import pytest
from support import gguf_files, qwen_material

pytestmark = pytest.mark.real_model  # converts a 0.5B model and loads it into llama.cpp

NAME = qwen_material.FOLDER_NAME
# Texts whose tokens llama.cpp's qwen2 pre-tokenizer and BPE must split the same way from
# both files: code with tabs and CRLF, CJK, emoji sequences, digits, contractions,
# whitespace runs, scripts far from Latin, and the special tokens' strings.
TEXTS = [
    'def fib(n: int) -> int:\n\treturn n if n < 2 else fib(n - 1) + fib(n - 2)\n\n\nprint("ok")',
    '#include <stdio.h>\r\nint main(void) {\r\n    printf("%d\\n", 42);\r\n}\r\n',
    "const f = async (x) => { await fetch(`/api/${x}`); }; // TODO: 1e-6, 0x1F, 3.14159",
    "北京是中国的首都。我想在apple工作1314151天～ 日本語のテキストと한국어 텍스트",
    "Emoji: 🚀🦙✅ 👩\u200d👩\u200d👧 🇫🇷🇯🇵 😶\u200d🌫️ and numbers 3 33 333 3333 12345678",
    "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like tea?",
    "   leading spaces,\ttabs\n\n\nnew lines     and trailing   \n \n\n",
    'កាន់តែពិសេសអាច нещо на Български ------======= """"......!!!!!!??????',
    "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|endoftext|><|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>  return 1<|fim_pad|>",
    '<|repo_name|>memagent<|file_sep|>README.md\n<tool_call>{"name": "f"}</tool_call>',
    "<|vision_start|><|image_pad|><|vision_end|><|box_start|>(1,2)<|box_end|> <|im_start",
]


def requantize(source: Path, dest: Path, kind: str) -> Path:
    """`source` written as `kind` by llama.cpp's quantizer (llama-quantize
    --allow-requantize): quantized weights are dequantized by llama.cpp itself."""
    import llama_cpp

    llama_cpp.llama_log_set(_quiet, ctypes.c_void_p(0))  # its log of every tensor
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = int(gguf.LlamaFileType[f"MOSTLY_{kind}"])
    params.nthread = 2
    params.allow_requantize = True
    status = llama_cpp.llama_model_quantize(
        str(source).encode(), str(dest).encode(), ctypes.byref(params)
    )
    assert status == 0, f"llama.cpp could not write {dest} ({status})"
    return dest


def _ignore(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    return None


_quiet = None


@pytest.fixture(scope="module", autouse=True)
def quiet_llama_cpp() -> None:
    """A log callback held for the module's life (ctypes keeps only a pointer)."""
    global _quiet
    import llama_cpp

    _quiet = llama_cpp.llama_log_callback(_ignore)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("real")


@pytest.fixture(scope="module")
def shipped() -> Path:
    return qwen_material.shipped_gguf()


@pytest.fixture(scope="module")
def converted(work) -> Path:
    """memagent's conversion of the folder to BF16, as llama.cpp converts bf16 weights."""
    from memagent_cli.models.conversion import convert as conversion

    folder = qwen_material.hf_folder()
    return conversion.convert(folder, work / f"{NAME}.BF16.gguf", "BF16")


@pytest.fixture(scope="module")
def reference(shipped, work) -> Path:
    """llama.cpp's BF16 of the shipped GGUF: its values, dequantized and rounded by
    llama.cpp, as its converter writes the folder's weights."""
    return requantize(shipped, work / "llama.BF16.gguf", "BF16")


def load(path: Path, **kwargs):
    from llama_cpp import Llama

    from memagent_cli.backends.build import placement_for
    from memagent_cli.backends.llama_patches import placed_weights

    with placed_weights(placement_for(path)):  # llama.cpp's AMX buffers crash (build.py)
        return Llama(model_path=str(path), n_threads=2, verbose=False, **kwargs)


def logits(path: Path, tokens: list[int]) -> np.ndarray:
    llm = load(path, n_ctx=128, logits_all=True)
    llm.eval(tokens)
    return np.asarray(llm.scores[: len(tokens)], dtype=np.float64)


def test_metadata_is_what_llama_cpp_wrote(shipped, converted):
    """Every key of the shipped GGUF (architecture, all 151,936 tokens and their types,
    151,387 merges, special ids, pre-tokenizer, chat template, name), value for value."""
    expected, _ = gguf_files.read(shipped)
    meta, _ = gguf_files.read(converted)
    assert len(expected["tokenizer.ggml.tokens"]) == 151936
    assert len(expected["tokenizer.ggml.merges"]) == 151387
    assert expected["tokenizer.ggml.pre"] == "qwen2"
    assert "<|im_start|>" in expected["tokenizer.chat_template"]
    assert [k for k in expected if meta.get(k) != expected[k]] == ["general.file_type"]
    assert (meta["general.file_type"], expected["general.file_type"]) == (
        gguf.LlamaFileType.MOSTLY_BF16,
        gguf.LlamaFileType.MOSTLY_Q4_K_M,
    )
    # Newer llama.cpp converters than the shipped file's also copy generation_config.json's
    # sampling defaults, as gguf.Metadata does here.
    # memagent's own key: the reader the model was trained for (MemAgent's by default).
    assert meta.pop("memagent.reader") == "memagent"
    extra = {k: round(v, 6) for k, v in meta.items() if k not in expected}
    assert extra == {
        "general.sampling.top_k": 20,
        "general.sampling.top_p": 0.8,
        "general.sampling.temp": 0.7,
    }


def test_tensors_are_llama_cpp_s_after_the_same_rounding(shipped, converted, reference):
    """All 291 tensors in the order llama.cpp's converter wrote them, with its shapes and
    types, equal bit for bit to llama.cpp's BF16 of the shipped GGUF; and, read without
    llama.cpp, one tensor of each stored type within bf16's rounding (half a unit in the
    8th bit) of the shipped value dequantized."""
    _, ours = gguf_files.read(converted)
    _, theirs = gguf_files.read(reference)  # the quantizer sorts tensors by layer
    _, original = gguf_files.read(shipped)  # in the converter's order
    assert list(ours) == list(original) and len(ours) == 291
    assert {n: (t.shape, t.kind) for n, t in ours.items()} == {
        n: (t.shape, t.kind) for n, t in theirs.items()
    }
    different = [name for name, t in ours.items() if not np.array_equal(t.raw, theirs[name].raw)]
    assert different == []

    samples = {  # the shipped types: Q5_0, Q6_K, Q4_K, Q8_0, F32
        "blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.11.ffn_down.weight",
        "blk.0.attn_v.weight", "blk.0.attn_q.bias",
    }  # fmt: skip
    assert {original[n].kind.name for n in samples} == {"Q5_0", "Q6_K", "Q4_K", "Q8_0", "F32"}
    for name in samples:
        value, got = original[name].values(), ours[name].values()
        if original[name].kind == gguf.GGMLQuantizationType.F32:
            assert np.array_equal(got, value), name  # norms and biases stay float32
        else:
            assert ours[name].kind == gguf.GGMLQuantizationType.BF16
            assert (np.abs(got - value) <= np.abs(value) * 2.0**-8).all(), name
            assert not np.array_equal(got, value)  # rounded indeed: the check can fail


def test_tokenization_is_llama_cpp_s(shipped, converted):
    """llama.cpp's tokenizer from either file, special tokens matched or not."""
    theirs, ours = load(shipped, vocab_only=True), load(converted, vocab_only=True)
    for text in TEXTS:
        for special in (True, False):
            expected = theirs.tokenize(text.encode(), add_bos=False, special=special)
            assert ours.tokenize(text.encode(), add_bos=False, special=special) == expected
            assert ours.detokenize(expected, special=special) == theirs.detokenize(
                expected, special=special
            )
    chat = theirs.tokenize(TEXTS[8].encode(), add_bos=False, special=True)
    assert chat[0] == 151644 and chat.count(151645) == 2  # <|im_start|>, <|im_end|>: one id


def test_logits_are_llama_cpp_s(converted, reference):
    """The same weights, bit for bit, and the same hyperparameters: llama.cpp's CPU kernels
    give the same logits to the last bit at a fixed thread count, so the tolerance is zero
    and any difference is something the files disagree on."""
    tokens = load(reference, vocab_only=True).tokenize(
        (TEXTS[8] + TEXTS[0]).encode(), add_bos=False, special=True
    )
    expected = logits(reference, tokens)
    assert np.abs(expected).max() > 10 and len(set(expected.argmax(-1))) > 5  # not noise
    assert np.array_equal(logits(converted, tokens), expected)


def test_f16_logits_are_llama_cpp_s(memagent, converted, reference, work):
    """F16 written by `memagent models convert --quant F16` from the bf16 folder, against
    llama.cpp's quantizer writing its BF16 as F16: the same values (bf16 fits in F16 here),
    so the same logits to the last bit again."""
    out = work / f"{NAME}.F16.gguf"
    result = memagent(
        "models", "convert", str(qwen_material.hf_folder()), "--quant", "F16", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    theirs = requantize(reference, work / "llama.F16.gguf", "F16")
    kinds = {t.kind.name for t in gguf_files.read(out)[1].values()}
    assert kinds == {"F16", "F32"}
    tokens = load(theirs, vocab_only=True).tokenize(TEXTS[0].encode(), add_bos=False)
    assert np.array_equal(logits(out, tokens), logits(theirs, tokens))
