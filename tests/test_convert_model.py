"""Converted models run in llama.cpp as the original would: logits equal to a numpy
forward pass of the same weights, the same tokens as the `tokenizers` library, the same
chat prompt; K-quants that really are K-quants; bf16 values F16 cannot hold quantized
through BF16; a quantized conversion answers through `memagent ask`, and never costs a
model pulled before it. The tiny models carry the real Qwen2.5 tokenizer. Run under the
llama.cpp lock: flock /tmp/memagent-llama.lock pytest tests/test_convert_model.py"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from support import gguf_files
from support.command import words
from support.fake_hub import FakeHub, HubFile, use_hub
from support.hf_model import build, forward

pytestmark = pytest.mark.model

SAMPLES = [
    "The captain kept the logbook in the chart room.",
    "Crème brûlée, déjà vu, naïve façade; Ærøskøbing",
    "北京是中国的首都。我们在图书馆读书。",
    "Emoji: 🚀🦙✅ 👩‍👩‍👧 and numbers 3.14159 2026 1e-6",
    "  leading spaces,\ttabs\n\nnew lines   and trailing  ",
    "<|im_start|>user\nWhat is in the logbook?<|im_end|>\n<|im_start|>assistant\n",
    # What InfMem's prompts and replies hold (readers/infmem.py): Qwen-Agent's markers.
    '<think>\nSearch.\n</think>\n\n✿FUNCTION✿: retrievesearch\n✿ARGS✿: {"query": "log"}',
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

    from memagent_cli.backends.build import placement_for
    from memagent_cli.backends.llama_patches import placed_weights

    with placed_weights(placement_for(path)):  # llama.cpp's AMX buffers crash (build.py)
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
    assert {p.name for p in tmp_path.iterdir()} == {out.name, kept, f"{kept}.keep"}
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
    # Qwen3's tokenizer is Qwen2.5's vocabulary: through the Qwen3 GGUF it tokenizes as
    # the `tokenizers` library does (InfMem-4B is a Qwen3).
    reference = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for text in SAMPLES:
        ids = reference.encode(text).ids
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == ids, text
        assert llm.detokenize(ids, special=True).decode() == reference.decode(
            ids, skip_special_tokens=False
        )


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


def test_quantization_reports_its_progress_a_tensor_at_a_time(models, tmp_path):
    import gguf

    from memagent_cli.models.conversion import quantize
    from memagent_cli.models.gguf import read

    _, source, _ = models["untied"]
    calls: list[tuple[str, int, int | None]] = []
    quantize.quantize(source, tmp_path / "q.gguf", "Q8_0", progress=lambda *c: calls.append(c))
    assert read(tmp_path / "q.gguf").quantization == "Q8_0"
    tensors = gguf.GGUFReader(source).tensors
    size = source.stat().st_size
    assert {what for what, _, _ in calls} == {"quantizing to Q8_0"}
    assert len(calls) == len(tensors) + 1 and calls[-1][1:] == (size, size)  # then the end
    done = [0] + [d for _, d, _ in calls[:-1]]
    steps = sorted(b - a for a, b in zip(done, done[1:], strict=False))
    assert steps == sorted(int(t.n_bytes) for t in tensors)  # each call one tensor more


def test_a_failed_quantization_gives_llama_cpp_s_reason_and_what_is_left(models, tmp_path):
    from memagent_cli.errors import ModelError
    from memagent_cli.models.conversion import quantize

    _, source, _ = models["untied"]
    cut = tmp_path / "cut.gguf"  # an intermediate damaged after it was written
    cut.write_bytes(source.read_bytes()[: source.stat().st_size * 2 // 3])
    dest = tmp_path / "m.gguf.part"  # as the converter names what it quantizes into
    with pytest.raises(ModelError) as failed:
        quantize.quantize(cut, dest, "Q8_0")
    said = failed.value.message
    assert said.startswith("llama.cpp could not quantize cut.gguf to Q8_0: ")
    assert "data is not within the file bounds" in said  # llama.cpp's own words
    assert f"nothing of m.gguf was kept, and {cut} (" in said and "the same command again" in said
    assert not dest.exists() and cut.is_file()


# Rows of 256 values: K-quant blocks fit, so llama.cpp keeps Q4_K_M's own types instead of
# falling back to Q5_0/Q8_0 as it does for the tiny model (64) and Qwen2.5-0.5B (896).
K_SIZES = {"hidden_size": 256, "intermediate_size": 512}


@pytest.mark.slower  # 12 s: make test-real runs it
def test_q4_k_m_of_rows_of_256_is_made_of_q4_k_and_q6_k_and_computes_the_model(tmp_path):
    from tokenizers import Tokenizer

    from memagent_cli.models.conversion import convert as conversion

    folder = tmp_path / "Tiny-Qwen2"
    weights = build(folder, tied=False, dtype="BF16", sizes=K_SIZES)
    path = conversion.convert(folder, tmp_path / "tiny.Q4_K_M.gguf", "Q4_K_M")
    meta, tensors = gguf_files.read(path)
    assert meta["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q4_K_M
    kinds = {name: t.kind.name for name, t in tensors.items() if len(t.shape) == 2}
    assert set(kinds.values()) == {"Q4_K", "Q6_K"}, kinds
    assert kinds["blk.0.attn_q.weight"] == kinds["token_embd.weight"] == "Q4_K"
    assert kinds["output.weight"] == "Q6_K"  # as llama.cpp's Q4_K_M: more bits for the head

    tokens = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(SAMPLES[0]).ids
    llm = load(path, n_ctx=256, logits_all=True)
    llm.eval(tokens)
    got = np.asarray(llm.scores[: len(tokens)], dtype=np.float64)
    expected = forward(weights, tokens, K_SIZES)
    # 4.5-6.6 bits a weight move these random weights' logits by 20-40% of their spread
    # (each position's correlate 0.91-0.98 with the exact ones, measured), while another
    # seed's model correlates 0.00 +- 0.01: above 0.8 it is this model, quantized.
    for row_got, row_expected in zip(got, expected, strict=True):
        assert np.corrcoef(row_got, row_expected)[0, 1] > 0.8


def test_the_types_nearest_those_needing_an_importance_matrix_are_made_without_one(tmp_path):
    """IQ3_S and Q2_K, offered by --help and the refusals, sit next to IQ3_XS and Q2_K_S,
    which need a matrix: llama.cpp makes them from a K-quant-shaped model with none, as
    those file types. Other offered types are made in the tests above and in
    test_convert.py; these take about 5 s each (the 152K-row embedding), so not all."""
    from memagent_cli.models.conversion import convert as conversion
    from memagent_cli.models.conversion import quantize

    folder = tmp_path / "Tiny-Qwen2"
    build(folder, dtype="BF16", sizes=K_SIZES)  # tied: one 152K-row matrix to quantize, not two
    source = conversion.convert(folder, tmp_path / "tiny.BF16.gguf", "BF16")
    for name in ("IQ3_S", "Q2_K"):
        assert name in quantize.file_types() and name not in quantize.NEEDS_IMATRIX
        out = tmp_path / f"tiny.{name}.gguf"
        quantize.quantize(source, out, name)
        meta, _ = gguf_files.read(out)
        assert meta["general.file_type"] == quantize.file_type(name), name
        out.unlink()


def test_bf16_beyond_f16_range_quantizes_through_bf16_and_loads(memagent, tmp_path):
    """The F16 output refuses such a model (tests/test_convert.py); a quantized one is
    quantized from a BF16 intermediate, as llama.cpp's converter writes bf16 weights."""
    folder = tmp_path / "Tiny-Qwen2"
    build(folder, values={("model.embed_tokens.weight", 5, 3): 99840.0})  # exact in bf16
    out = tmp_path / "tiny.Q8_0.gguf"
    result = memagent("models", "convert", str(folder), "--quant", "Q8_0", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "BF16" in words(result.stderr) and "(temporary)" in words(result.stderr)
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == [out.name]
    embedding = gguf_files.read(out)[1]["token_embd.weight"].values()
    assert np.isfinite(embedding).all()
    assert embedding[5, 3] == pytest.approx(99840, rel=1e-3)
    llm = load(out, n_ctx=64, logits_all=True)
    llm.eval([5, 100, 5])
    assert np.isfinite(np.asarray(llm.scores[:3])).all()


def test_pulling_another_type_keeps_the_f16_model_pulled_before(memagent, env, models, tmp_path):
    """The data loss of issue 17: the F16 intermediate was NAME.F16.gguf, the path of a
    pulled F16 model, and was deleted after quantizing."""
    folder, _, _ = models["tied"]  # bf16 weights
    repo = "someone/Tiny-Qwen2"
    with FakeHub() as hub:
        files = {
            p.name: HubFile(p.read_bytes(), lfs=p.suffix == ".safetensors")
            for p in folder.iterdir()
        }
        hub.add(repo, files)
        use_hub(env, hub, tmp_path / "hf")
        first = memagent("models", "pull", f"{repo}:F16")
        assert first.returncode == 0, first.stderr
        f16 = Path(first.stdout.strip())
        assert f16.name == "Tiny-Qwen2.F16.gguf"
        content, written = f16.read_bytes(), f16.stat().st_mtime_ns
        second = memagent("models", "pull", repo)  # the default type, Q4_K_M
    assert second.returncode == 0, second.stderr
    quantized = Path(second.stdout.strip())
    assert quantized == f16.with_name("Tiny-Qwen2.Q4_K_M.gguf")
    said = words(second.stderr)
    assert "BF16" in said and "(temporary)" in said  # the intermediate: not a .gguf name
    assert sorted(p.name for p in f16.parent.iterdir()) == sorted([f16.name, quantized.name])
    assert f16.read_bytes() == content and f16.stat().st_mtime_ns == written
