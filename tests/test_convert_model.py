"""Converted models run in llama.cpp as the original would: logits equal to a numpy
forward pass of the same weights, the same tokens as the `tokenizers` library, the same
chat prompt; a quantized conversion answers through `memagent ask`. The tiny models carry
the real Qwen2.5 tokenizer. Run under the llama.cpp lock:
flock /tmp/memagent-llama.lock pytest tests/test_convert_model.py"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import words
from fake_hub import FakeHub, HubFile
from hf_model import build, forward

pytestmark = pytest.mark.model

SAMPLES = [
    "The captain kept the logbook in the chart room.",
    "Crème brûlée, déjà vu, naïve façade; Ærøskøbing",
    "北京是中国的首都。我们在图书馆读书。",
    "Emoji: 🚀🦙✅ 👩‍👩‍👧 and numbers 3.14159 2026 1e-6",
    "  leading spaces,\ttabs\n\nnew lines   and trailing  ",
    "<|im_start|>user\nWhat is in the logbook?<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, tuple[Path, Path, dict[str, np.ndarray]]]:
    """The tiny model, tied (bf16 weights) and untied (f32 weights), converted at F32."""
    from memagent_cli.models.conversion import convert as conversion

    out = {}
    for name, tied, dtype in (("tied", True, "BF16"), ("untied", False, "F32")):
        folder = tmp_path_factory.mktemp(name) / "Tiny-Qwen2"
        weights = build(folder, tied=tied, dtype=dtype, seed=int(tied))
        gguf_path = conversion.convert(folder, folder.parent / "tiny.F32.gguf", "F32")
        out[name] = (folder, gguf_path, weights)
    return out


def load(path: Path, **kwargs):
    from llama_cpp import Llama

    return Llama(model_path=str(path), n_threads=2, verbose=False, **kwargs)


@pytest.mark.parametrize("kind", ["tied", "untied"])
def test_f32_logits_equal_a_numpy_forward_pass(models, kind):
    from tokenizers import Tokenizer

    folder, path, weights = models[kind]
    tokens = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(SAMPLES[0] + SAMPLES[2]).ids
    # An F32 KV cache: the default F16 one would round keys and values.
    llm = load(path, n_ctx=256, logits_all=True, type_k=0, type_v=0)
    llm.eval(tokens)
    got = np.asarray(llm.scores[: len(tokens)], dtype=np.float64)
    expected = forward(weights, tokens)
    assert got.shape == expected.shape
    scale = np.abs(expected).max()
    assert scale > 1  # logits that differ from token to token, not noise around zero
    assert np.abs(got - expected).max() < 1e-4 * scale
    assert (got.argmax(-1) == expected.argmax(-1)).all()


def test_tokenization_equals_the_tokenizers_library(models):
    from tokenizers import Tokenizer

    folder, path, _ = models["tied"]
    reference = Tokenizer.from_file(str(folder / "tokenizer.json"))
    llm = load(path, vocab_only=True)
    for text in SAMPLES:
        ids = reference.encode(text).ids
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == ids, text
        assert llm.detokenize(ids, special=True).decode() == reference.decode(
            ids, skip_special_tokens=False
        )


def test_the_chat_template_renders_a_user_message_as_the_original(models):
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    folder, path, _ = models["tied"]
    original = json.loads((folder / "tokenizer_config.json").read_text())["chat_template"]
    embedded = load(path, vocab_only=True).metadata["tokenizer.chat_template"]
    messages = [{"role": "user", "content": "Who kept the logbook?"}]

    def render(template: str) -> str:
        return Jinja2ChatFormatter(template, eos_token="<|im_end|>", bos_token="")(
            messages=messages
        ).prompt

    assert embedded == original
    assert render(embedded) == render(original)
    assert render(embedded) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n<|im_start|>user\nWho kept the logbook?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_q4_k_m_conversion_loads_and_answers_through_memagent_ask(memagent, models, tmp_path):
    folder, _, _ = models["untied"]
    out = tmp_path / "Tiny-Qwen2.Q4_K_M.gguf"
    result = memagent("models", "convert", str(folder), "--out", str(out), "--keep-intermediate")
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == out
    # f32 weights: quantized from F16 (BF16 only where the weights are bf16)
    kept = "Tiny-Qwen2.intermediate.F16"
    assert {p.name for p in tmp_path.iterdir()} == {out.name, kept}
    info = json.loads(memagent("models", "info", str(out), "--json").stdout)
    assert info["quantization"] == "Q4_K_M" and info["architecture"] == "qwen2"

    document = tmp_path / "log.txt"
    document.write_text("The captain kept the logbook in the chart room. " * 40)
    ask = memagent(
        "ask", str(document), "Where is the logbook?", "-m", str(out),
        "--chunk-tokens", "200", "--memory-tokens", "32", "--temperature", "0", "--no-trace",
        "--quiet", "--json",
    )  # fmt: skip
    assert ask.returncode == 0, ask.stderr
    run = json.loads(ask.stdout)
    assert len(run["steps"]) == run["document"]["chunks"] > 1  # read to the end
    assert isinstance(run["reply"], str) and run["model"]["path"] == str(out)

    again = memagent(
        "models", "convert", str(folder), "--out", str(tmp_path / "q8.gguf"), "--quant", "Q8_0"
    )
    assert again.returncode == 0, again.stderr
    assert kept in {p.name for p in tmp_path.iterdir()}  # kept from before
    assert not (tmp_path / "q8.intermediate.F16").exists()  # this one's was removed


def test_pull_of_weights_quantizes_and_registers_for_model_option(memagent, env, models, tmp_path):
    folder, _, _ = models["tied"]
    repo = "someone/Tiny-Qwen2"
    with FakeHub() as hub:
        files = {
            p.name: HubFile(p.read_bytes(), lfs=p.suffix == ".safetensors")
            for p in folder.iterdir()
        }
        hub.add(repo, files)
        env.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"), NO_PROXY="127.0.0.1")
        env.pop("HF_TOKEN", None)
        pulled = memagent("models", "pull", f"{repo}:Q8_0")
    assert pulled.returncode == 0, pulled.stderr
    assert "quantizing to Q8_0" in words(pulled.stderr)
    path = Path(pulled.stdout.strip())
    assert path.name == "Tiny-Qwen2.Q8_0.gguf"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no F16, no weights left

    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # the Hub is gone: the GGUF is enough
    document = tmp_path / "log.txt"
    document.write_text("The captain kept the logbook in the chart room. " * 20)
    ask = memagent(
        "ask", str(document), "Where is the logbook?", "-m", f"hf:{repo}:Q8_0",
        "--chunk-tokens", "200", "--memory-tokens", "32", "--temperature", "0", "--no-trace",
        "--quiet", "--json",
    )  # fmt: skip
    assert ask.returncode == 0, ask.stderr
    run = json.loads(ask.stdout)
    assert run["model"]["path"] == str(path) and len(run["steps"]) == run["document"]["chunks"]


def test_qwen3_logits_equal_a_numpy_forward_pass(tmp_path):
    """Qwen3: no q/k/v biases, RMSNorm of each head's query and key, its own head size."""
    from tokenizers import Tokenizer

    from memagent_cli.models.conversion import convert as conversion

    folder = tmp_path / "Tiny-Qwen3"
    weights = build(folder, tied=True, dtype="BF16", qwen3=True)
    path = conversion.convert(folder, tmp_path / "tiny3.gguf", "F32")
    tokens = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(SAMPLES[1]).ids
    llm = load(path, n_ctx=256, logits_all=True, type_k=0, type_v=0)
    assert llm.metadata["general.architecture"] == "qwen3"
    llm.eval(tokens)
    got = np.asarray(llm.scores[: len(tokens)], dtype=np.float64)
    expected = forward(weights, tokens)
    assert np.abs(got - expected).max() < 1e-4 * np.abs(expected).max()


def test_a_registry_model_s_folder_converts_to_where_its_name_finds_it(memagent, env, tmp_path):
    folder = tmp_path / "RL-MemoryAgent-7B"  # the repository name of the registry's memagent-7b
    build(folder)
    result = memagent("models", "convert", str(folder), "--quiet")
    assert result.returncode == 0, result.stderr
    path = Path(result.stdout.strip())
    assert path.parts[-3:] == ("BytedTsinghua-SIA", "RL-MemoryAgent-7B", path.name)
    assert path.name == "RL-MemoryAgent-7B.Q4_K_M.gguf"
    info = json.loads(memagent("models", "info", "memagent-7b", "--json").stdout)
    assert info["path"] == str(path) and info["quantization"] == "Q4_K_M"
    rows = json.loads(memagent("models", "list", "--json").stdout)
    assert [r["path"] for r in rows if r["name"] == "memagent-7b"] == [str(path)]
