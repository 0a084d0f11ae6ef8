"""`memagent models convert` and `pull` of Hugging Face weights, checked without llama.cpp:
the GGUF's metadata and tensors against the tiny Qwen2 model they came from
(tests/support/hf_model.py, with the real Qwen2.5 tokenizer), the rope keys llama.cpp's
converter writes for each way a config.json says them, and every bad input refused with one
sentence and nothing half-written. Besides the slow tests marked `model`, only the runs that
resume from an intermediate use llama.cpp: its quantizer, on the tiny model, a second each."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from rich.filesize import decimal
from support import gguf_files
from support.command import MEMAGENT, assert_clean_failure, words
from support.fake_hub import FakeHub, HubFile, use_hub
from support.hf_model import build

from memagent_cli.errors import ModelError

TINY_REPO = "someone/Tiny-Qwen2"


@pytest.fixture(scope="module")
def tied(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    folder = tmp_path_factory.mktemp("hf") / "Tiny-Qwen2"
    return folder, build(folder, tied=True, dtype="BF16")


@pytest.fixture(scope="module")
def untied(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    folder = tmp_path_factory.mktemp("hf") / "Tiny-Qwen2-untied"
    return folder, build(folder, tied=False, dtype="F32", seed=1)


def test_f32_conversion_writes_what_llama_cpp_s_converter_writes(cli, tied, tmp_path):
    folder, weights = tied
    out = tmp_path / "tiny.gguf"
    result = cli("models", "convert", str(folder), "--quant", "F32", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{out}\n"
    assert "converting Qwen2ForCausalLM" in words(result.stderr)
    assert [p.name for p in tmp_path.iterdir()] == ["tiny.gguf"]  # no .part, no F16 left

    meta, written = gguf_files.read(out)
    config = json.loads((folder / "config.json").read_text())
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    template = json.loads((folder / "tokenizer_config.json").read_text())["chat_template"]
    expected = {
        "general.architecture": "qwen2",
        "qwen2.block_count": config["num_hidden_layers"],
        "qwen2.context_length": config["max_position_embeddings"],
        "qwen2.embedding_length": config["hidden_size"],
        "qwen2.feed_forward_length": config["intermediate_size"],
        "qwen2.attention.head_count": config["num_attention_heads"],
        "qwen2.attention.head_count_kv": config["num_key_value_heads"],
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.bos_token_id": config["bos_token_id"],
        "tokenizer.ggml.eos_token_id": tokenizer["added_tokens"][2]["id"],  # <|im_end|>
        "tokenizer.ggml.padding_token_id": tokenizer["added_tokens"][0]["id"],  # <|endoftext|>
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": template,
        "general.file_type": gguf.LlamaFileType.ALL_F32,
    }
    assert {k: meta.get(k) for k in expected} == expected
    assert meta["qwen2.rope.freq_base"] == pytest.approx(config["rope_theta"])
    assert meta["qwen2.attention.layer_norm_rms_epsilon"] == pytest.approx(config["rms_norm_eps"])

    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == config["vocab_size"] == 151936
    vocab = tokenizer["model"]["vocab"]
    assert all(tokens[i] == t for t, i in vocab.items())
    added = tokenizer["added_tokens"]
    assert all(tokens[a["id"]] == a["content"] for a in added)
    # As llama.cpp types them: CONTROL when special or "<|...|>" (the FIM and repo tokens
    # are not special in tokenizer.json), else USER_DEFINED.
    user_defined = {a["content"] for a in added if types[a["id"]] == gguf.TokenType.USER_DEFINED}
    assert user_defined == {"<tool_call>", "</tool_call>"}
    control = [a for a in added if types[a["id"]] == gguf.TokenType.CONTROL]
    assert len(control) == 20 and "<|fim_prefix|>" in {a["content"] for a in control}
    assert not next(a for a in added if a["content"] == "<|fim_prefix|>")["special"]
    used = len(vocab) + len(added)
    assert all(t == gguf.TokenType.UNUSED for t in types[used:]) and used < len(types)
    assert tokens[used] == f"[PAD{used}]"
    assert all(types[i] == gguf.TokenType.NORMAL for i in vocab.values())
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    assert meta["tokenizer.ggml.merges"] == merges

    # Every weight, bit for bit, under its GGUF name; the tied model has no output.weight.
    assert "output.weight" not in written
    assert len(written) == len(weights)
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "model.layers.1.self_attn.k_proj.bias": "blk.1.attn_k.bias",
        "model.layers.0.mlp.down_proj.weight": "blk.0.ffn_down.weight",
        "model.layers.1.input_layernorm.weight": "blk.1.attn_norm.weight",
    }
    for hf_name, gguf_name in names.items():
        tensor = written[gguf_name]
        assert tensor.kind == gguf.GGMLQuantizationType.F32
        assert np.array_equal(tensor.values(), weights[hf_name])


def test_f16_conversion_keeps_norms_and_biases_f32_and_writes_an_untied_head(cli, untied, tmp_path):
    folder, weights = untied
    out = tmp_path / "untied.F16.gguf"
    result = cli("models", "convert", str(folder), "--quant", "f16", "--out", str(out))
    assert result.returncode == 0, result.stderr
    _, written = gguf_files.read(out)
    head = written["output.weight"]
    assert head.kind == gguf.GGMLQuantizationType.F16
    expected = weights["lm_head.weight"].astype(np.float16)
    assert np.array_equal(head.raw.view(np.float16).reshape(expected.shape), expected)
    for name, tensor in written.items():
        one_dimensional = len(tensor.shape) == 1 or name.endswith("_norm.weight")
        assert (tensor.kind == gguf.GGMLQuantizationType.F32) == one_dimensional, name


def test_convert_without_out_goes_where_list_finds_it(cli, tied):
    folder, _ = tied
    result = cli("models", "convert", str(folder), "--quant", "F16", "--quiet")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    path = Path(result.stdout.strip())
    assert path.name == "Tiny-Qwen2.F16.gguf" and path.is_file()
    rows = json.loads(cli("models", "list", "--json").stdout)
    row = next(r for r in rows if r["path"] == str(path))
    assert (row["architecture"], row["quantization"]) == ("qwen2", "F16")
    assert row["has_chat_template"] is True


# rope: the keys llama.cpp's converter writes --------------------------------------------

# What convert_hf_to_gguf.py (llama.cpp as vendored in llama-cpp-python 0.3.36) wrote for
# Qwen2.5-Coder-0.5B with these config.json settings, run on the real model folder: the
# same keys whether transformers 4.57 or 5.23 read the config, and whether it keeps the
# rope in rope_theta and rope_scaling (the Hub's files, "type" only; transformers 4.57 adds
# "rope_type") or in rope_parameters (transformers 5).
YARN = {
    "qwen2.rope.scaling.type": "yarn",
    "qwen2.rope.scaling.factor": 4.0,
    "qwen2.rope.scaling.original_context_length": 32768,
}
LINEAR = {"qwen2.rope.scaling.type": "linear", "qwen2.rope.scaling.factor": 2.0}
YARN_SETTINGS = {"factor": 4.0, "original_max_position_embeddings": 32768}
ROPE = {
    "v5": ({"rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}, {}),
    "hub-yarn": ({"rope_theta": 1e6, "rope_scaling": {**YARN_SETTINGS, "type": "yarn"}}, YARN),
    "v5-yarn": (
        {"rope_parameters": {**YARN_SETTINGS, "rope_theta": 1e6, "rope_type": "yarn"}},
        YARN,
    ),
    "v4.57-linear": (
        {
            "rope_theta": 1e6,
            "rope_scaling": {"factor": 2.0, "rope_type": "linear", "type": "linear"},
        },
        LINEAR,
    ),
    "v5-linear": (
        {"rope_parameters": {"factor": 2.0, "rope_theta": 1e6, "rope_type": "linear"}},
        LINEAR,
    ),
}


@pytest.mark.parametrize("style", list(ROPE))
def test_rope_settings_give_the_keys_llama_cpp_writes(tied, tmp_path, style):
    from memagent_cli.models.conversion import convert as conversion

    folder = shutil.copytree(tied[0], tmp_path / "Tiny-Qwen2")
    settings, scaling = ROPE[style]
    config = json.loads((folder / "config.json").read_text())
    config = {k: v for k, v in config.items() if k not in ("rope_theta", "rope_scaling")}
    (folder / "config.json").write_text(json.dumps(config | settings))
    out = conversion.convert(folder, tmp_path / "tiny.F16.gguf", "F16")
    meta, _ = gguf_files.read(out)
    rope = {k: v for k, v in meta.items() if k.startswith("qwen2.rope.")}
    assert rope == {"qwen2.rope.freq_base": 1e6, **scaling}


def test_bf16_beyond_f16_range_is_refused_for_f16_with_a_sentence(cli, tmp_path):
    """bf16 reaches 3e38, F16 65504: F16 would hold inf. A quantized type goes through a
    BF16 intermediate instead (tests/test_convert_model.py)."""
    folder = tmp_path / "Tiny-Qwen2"
    build(folder, values={("model.embed_tokens.weight", 5, 3): 99840.0})  # exact in bf16
    out = tmp_path / "out"
    out.mkdir()
    result = cli("models", "convert", str(folder), "--quant", "F16", "--out", str(out / "m.gguf"))
    assert_clean_failure(
        result, 1, "Tensor token_embd.weight holds values beyond F16's range", "convert to BF16"
    )
    assert not list(out.iterdir())


def test_f32_beyond_f16_range_is_refused_for_a_quantized_type_without_offering_one(cli, tmp_path):
    """float32 weights are quantized from an F16 intermediate (as llama.cpp's converter
    does): the refusal names the types that hold them, not a quantized one."""
    folder = tmp_path / "Tiny-Qwen2"
    build(folder, dtype="F32", values={("model.embed_tokens.weight", 5, 3): 99840.0})
    out = tmp_path / "out"
    out.mkdir()
    result = cli("models", "convert", str(folder), "--quant", "Q8_0", "--out", str(out / "m.gguf"))
    assert_clean_failure(result, 1, "beyond F16's range", "convert to BF16 or F32 (")
    assert "or to a quantized type" not in words(result.stderr)
    assert not list(out.iterdir())


# bad input: one sentence, exit 1, nothing written --------------------------------------


def broken_copy(source: Path, target: Path, how: str) -> Path:
    shutil.copytree(source, target)
    if how == "architecture":
        config = json.loads((target / "config.json").read_text())
        config["architectures"] = ["MistralForCausalLM"]
        (target / "config.json").write_text(json.dumps(config))
    elif how == "tokenizer":
        (target / "tokenizer.json").unlink()
    elif how == "truncated":
        shard = target / "model-00002-of-00002.safetensors"
        shard.write_bytes(shard.read_bytes()[:-1000])
    elif how == "config":
        (target / "config.json").write_text("{not json")
    elif how == "shard":
        (target / "model-00001-of-00002.safetensors").unlink()
    elif how == "pre-tokenizer":  # GPT-2's split: digits in runs, no "(?i:" contractions
        tokenizer = json.loads((target / "tokenizer.json").read_text())
        split = tokenizer["pre_tokenizer"]["pretokenizers"][0]
        split["pattern"]["Regex"] = GPT2_SPLIT
        (target / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    elif how == "vocab_size":  # smaller than the tokenizer: the added tokens have no rows
        config = json.loads((target / "config.json").read_text())
        config["vocab_size"] = 151643
        (target / "config.json").write_text(json.dumps(config))
    return target


GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


@pytest.mark.parametrize(
    ("how", "phrases"),
    [
        (
            "architecture",
            ["holds a MistralForCausalLM", "converts Qwen2ForCausalLM, Qwen3ForCausalLM"],
        ),
        ("tokenizer", ["has no tokenizer.json"]),
        ("truncated", ["model-00002-of-00002.safetensors is not a complete safetensors file"]),
        ("config", ["config.json"]),
        ("shard", ["model-00001-of-00002.safetensors is missing"]),
        ("pre-tokenizer", ["llama.cpp does not know the pre-tokenizer", "tokenizer.json"]),
        ("vocab_size", ["has token id 151664, but config.json's vocab_size is 151643"]),
    ],
)
def test_bad_model_folders_are_refused_with_one_sentence(cli, tied, tmp_path, how, phrases):
    folder = broken_copy(tied[0], tmp_path / "model", how)
    out = tmp_path / "out"
    out.mkdir()
    result = cli("models", "convert", str(folder), "--out", str(out / "m.gguf"))
    assert_clean_failure(result, 1, *phrases)
    assert len(result.stderr.strip().splitlines()) == 1
    assert not list(out.iterdir())


@pytest.mark.parametrize(
    ("quant", "why"),
    [
        ("Q4_K_X", "Q4_K_X is not a llama.cpp quantization type memagent makes"),
        ("iq2_xs", "iq2_xs needs an importance matrix"),
        ("IQ3_XS", "IQ3_XS needs an importance matrix"),
        ("TQ1_0", "TQ1_0 is for models trained in that format"),
    ],
)
def test_a_type_memagent_cannot_make_is_refused_naming_those_it_makes(
    cli, tied, tmp_path, quant, why
):
    result = cli("models", "convert", str(tied[0]), "--quant", quant, "--out", str(tmp_path))
    said = words(result.stderr.replace("│", " "))  # the usage error is drawn in a box
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in said
    assert why in said and "choose one of F32, F16, BF16, Q8_0, Q6_K" in said
    assert "IQ4_XS" in said and "Q2_K_S" not in said and "IQ2" not in said.replace(quant, "")
    assert not list(tmp_path.iterdir())


def test_help_lists_the_types_memagent_makes_and_those_it_does_not(cli):
    said = words(cli("models", "convert", "--help").stdout.replace("│", " "))
    assert "F32, F16, BF16, Q8_0, Q6_K, Q5_K_M" in said and "IQ3_S, Q2_K" in said
    assert "need an importance matrix (IQ1_S, IQ1_M, IQ2_XXS" in said


def on_a_small_disk(
    env, folder: Path, size: int, *args: str, keep: Path | None = None
) -> subprocess.CompletedProcess:
    """`memagent *args` with a real filesystem of `size` bytes (a tmpfs in a private mount
    namespace) mounted on `folder`; then `ls -A folder` on stderr, and a copy of what it
    holds in `keep`, since the tmpfs goes with its namespace. Skips where it cannot."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a small filesystem")
    folder.mkdir(exist_ok=True)
    command = shlex.join([str(MEMAGENT), *args])
    where = shlex.quote(str(folder))
    copy = f"cp -a {where}/. {shlex.quote(str(keep))}/; " if keep else ""
    script = (
        f"mount -t tmpfs -o size={size} tmpfs {where} || exit 77; "
        f"{command}; code=$?; ls -A {where} >&2; {copy}exit $code"
    )
    result = subprocess.run(
        ["unshare", "-r", "-m", "sh", "-c", script], capture_output=True, text=True, env=env
    )
    if result.returncode == 77:
        pytest.skip("cannot mount a tmpfs here")
    return result


def test_too_little_disk_space_is_refused_before_writing(tied, tmp_path, env):
    small = tmp_path / "small"
    result = on_a_small_disk(
        env, small, 64 << 10, "models", "convert", str(tied[0]), "--quant", "F16",
        "--out", f"{small}/m.gguf",
    )  # fmt: skip
    assert_clean_failure(result, 1, f"Not enough disk space in {small}", "are free")
    assert len(result.stderr.strip().splitlines()) == 2  # the sentence, then the plan note
    # `ls -A` of the small folder printed nothing: no .part, no half a GGUF


# pull of Hugging Face weights from a fake Hub -------------------------------------------


@pytest.fixture
def hub_with_weights(env, tmp_path, tied):
    """A Hub on 127.0.0.1 with the tiny model's files, as the released models are laid out."""
    folder, _ = tied
    with FakeHub() as server:
        files = {
            p.name: HubFile(p.read_bytes(), lfs=p.suffix == ".safetensors")
            for p in sorted(folder.iterdir())
        }
        files["README.md"] = HubFile(b"# tiny\n", lfs=False)
        server.add(TINY_REPO, files)
        use_hub(env, server, tmp_path / "hf")
        yield server


def repo_folder(env) -> Path:
    return Path(env["XDG_DATA_HOME"]) / "memagent" / "models" / "hf" / TINY_REPO


def test_pull_of_hugging_face_weights_converts_and_registers(cli, env, hub_with_weights):
    env["HF_TOKEN"] = "hf_secret"
    result = cli("models", "pull", f"{TINY_REPO}:F16")
    assert result.returncode == 0, result.stderr
    path = Path(result.stdout.strip())
    assert path == repo_folder(env) / "Tiny-Qwen2.F16.gguf"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # the weights are removed
    said = words(result.stderr)
    assert said.index("is published as Hugging Face weights") < said.index("downloading model-")
    assert "of disk needed" in said
    assert all(r.authorization == "Bearer hf_secret" for r in hub_with_weights.requests)
    assert not hub_with_weights.downloads("README.md")  # only what the conversion reads

    rows = json.loads(cli("models", "list", "--json").stdout)
    row = next(r for r in rows if r["path"] == str(path))
    assert row["name"] == f"hf:{TINY_REPO}:F16" and row["architecture"] == "qwen2"
    again = cli("models", "pull", f"{TINY_REPO}:F16")
    assert again.returncode == 0 and "already pulled" in again.stderr
    assert len(hub_with_weights.downloads("model-00001-of-00002.safetensors")) == 1

    made = path.read_bytes()  # a power loss can leave a file of the right size full of zeros
    path.write_bytes(bytes(len(made)))
    zeros = cli("models", "pull", f"{TINY_REPO}:F16")
    assert zeros.returncode == 0, zeros.stderr
    assert f"{path} is damaged" in words(zeros.stderr) and "making it again" in zeros.stderr
    assert path.read_bytes() == made


def test_an_interrupted_pull_of_weights_resumes_where_it_stopped(cli, env, hub_with_weights):
    shard = "model-00001-of-00002.safetensors"
    served = hub_with_weights.repos[TINY_REPO][shard]
    served.drop_after, served.then_fail = 50_000, True  # hangs up, then the Hub is down
    first = cli("models", "pull", f"{TINY_REPO}:F16")
    assert_clean_failure(first, 1, f"Download of {shard} stopped", "Run the same command again")
    assert not list(repo_folder(env).rglob("*.gguf*"))  # nothing that looks like a model
    (partial,) = repo_folder(env).rglob("*.incomplete")
    kept = partial.stat().st_size
    assert 0 < kept < len(served.content)

    served.then_fail = False
    second = cli("models", "pull", f"{TINY_REPO}:F16")
    assert second.returncode == 0, second.stderr
    assert "resuming" in second.stderr
    assert hub_with_weights.downloads(shard)[-1].range == f"bytes={kept}-"
    assert Path(second.stdout.strip()).is_file()


def test_an_unsupported_architecture_is_refused_before_the_weights_download(
    cli, env, hub_with_weights
):
    files = hub_with_weights.repos[TINY_REPO]
    config = json.loads(files["config.json"].content)
    config["architectures"] = ["GPT2LMHeadModel"]
    files["config.json"] = HubFile(json.dumps(config).encode(), lfs=False)
    result = cli("models", "pull", TINY_REPO)
    assert_clean_failure(result, 1, "holds a GPT2LMHeadModel", "memagent converts Qwen2ForCausalLM")
    assert not hub_with_weights.downloads("model-00001-of-00002.safetensors")


def test_a_repository_without_tokenizer_json_is_refused_before_downloading(
    cli, env, hub_with_weights
):
    del hub_with_weights.repos[TINY_REPO]["tokenizer.json"]
    result = cli("models", "pull", TINY_REPO)
    assert_clean_failure(result, 1, f"{TINY_REPO} has no tokenizer.json")
    assert not [r for r in hub_with_weights.requests if "/resolve/" in r.path]


def test_pull_refuses_a_type_needing_an_importance_matrix_before_any_download(
    cli, hub_with_weights
):
    result = cli("models", "pull", f"{TINY_REPO}:IQ2_XXS")
    assert_clean_failure(result, 1, "IQ2_XXS needs an importance matrix", "choose one of F32")
    assert not [r for r in hub_with_weights.requests if "/resolve/" in r.path]


def test_pull_downloads_only_the_shards_the_index_names_and_reads_dtype(cli, env, untied, tmp_path):
    """A repository may hold other safetensors (a consolidated copy, an adapter) beside the
    shards; newer transformers write `dtype` where older ones wrote `torch_dtype`."""
    folder, _ = untied  # F32 weights: 4 bytes a parameter, which only `dtype` says
    files = {
        p.name: HubFile(p.read_bytes(), lfs=p.suffix == ".safetensors") for p in folder.iterdir()
    }
    config = json.loads(files["config.json"].content)
    config["dtype"] = config.pop("torch_dtype")
    files["config.json"] = HubFile(json.dumps(config).encode(), lfs=False)
    files["consolidated.safetensors"] = files["model-00001-of-00002.safetensors"]
    weights = sum(len(f.content) for n, f in files.items() if n.startswith("model-"))
    with FakeHub() as server:
        server.add(TINY_REPO, files)
        use_hub(env, server, tmp_path / "hf")
        result = cli("models", "pull", f"{TINY_REPO}:F16")
    assert result.returncode == 0, result.stderr
    assert not server.downloads("consolidated.safetensors")
    assert len(server.downloads("model-00002-of-00002.safetensors")) == 1
    vocabulary = len(files["tokenizer.json"].content)  # each GGUF holds it
    assert f"writing F16 {decimal(weights // 2 + vocabulary)}" in words(result.stderr)  # 2 from 4
    assert Path(result.stdout.strip()).is_file()


def test_pull_refuses_before_the_weights_when_the_quantizer_would_lack_memory(
    cli, hub_with_weights
):
    files = hub_with_weights.repos[TINY_REPO]
    config = json.loads(files["config.json"].content)
    config["vocab_size"] = 1 << 40  # an embedding of 2^46 values: 281 TB as float32
    files["config.json"] = HubFile(json.dumps(config).encode(), lfs=False)
    result = cli("models", "pull", f"{TINY_REPO}:Q8_0")
    assert_clean_failure(
        result,
        1,
        "of disk needed in",  # the plan says both, then the sentence says what is short
        "of memory (",
        # 2^46 values as float32 (281.5 TB) and as Q8_0 (74.8 TB), and 256 MiB for the rest
        "Not enough memory (about 356.2 TB needed: llama.cpp's quantizer holds the largest "
        "tensor as float32;",
        f"available) for pulling {TINY_REPO}.",
    )
    assert "Not enough disk" not in result.stderr
    assert not hub_with_weights.downloads("model-00001-of-00002.safetensors")


def test_a_hub_s_index_nested_too_deep_is_one_sentence(cli, hub_with_weights):
    files = hub_with_weights.repos[TINY_REPO]
    deep = '{"weight_map": ' + "[" * 200_000 + "]" * 200_000 + "}"
    files["model.safetensors.index.json"] = HubFile(deep.encode(), lfs=False)
    result = cli("models", "pull", f"{TINY_REPO}:F16")
    assert_clean_failure(result, 1, "model.safetensors.index.json is not a valid safetensors index")
    assert not hub_with_weights.downloads("model-00001-of-00002.safetensors")


def sparse_safetensors(path: Path, name: str, shape: tuple[int, ...]) -> None:
    """A safetensors file of one bf16 tensor whose bytes are a hole: terabytes that take
    no room on disk."""
    size = 2 * int(np.prod(shape, dtype=np.int64))
    header = json.dumps({name: {"dtype": "BF16", "shape": list(shape), "data_offsets": [0, size]}})
    raw = header.encode() + b" " * (-len(header) % 8)
    with path.open("wb") as file:
        file.write(len(raw).to_bytes(8, "little") + raw)
        file.truncate(8 + len(raw) + size)


def test_convert_says_disk_and_memory_and_refuses_when_both_are_short(cli, tied, tmp_path):
    folder = shutil.copytree(tied[0], tmp_path / "Huge-Qwen2")
    sparse_safetensors(folder / "head.safetensors", "lm_head.weight", (1 << 35, 64))
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["lm_head.weight"] = "head.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    out = tmp_path / "out"
    out.mkdir()
    result = cli("models", "convert", str(folder), "--out", str(out / "m.gguf"))
    assert_clean_failure(
        result, 1, f"of disk needed in {out} (", "of memory (", f"Not enough disk space in {out}"
    )
    # 2^41 values as float32 (8.8 TB) and as Q4_K_M (1.3 TB), and 256 MiB for the rest
    assert "nor memory (about 10.1 TB needed" in words(result.stderr)
    assert not list(out.iterdir())


def disk_needed(stderr: str) -> float:
    """The bytes of disk a pull said it needs."""
    return amount(r"([\d.]+) (bytes|kB|MB|GB) of disk needed", stderr)


def amount(pattern: str, stderr: str) -> float:
    """The bytes `pattern` (an amount, then its unit) finds in what a command said."""
    number, unit = re.search(pattern, words(stderr)).groups()
    return float(number) * {"bytes": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}[unit]


def test_delete_shards_frees_each_shard_once_converted_for_a_lower_peak(cli, env, hub_with_weights):
    plain = cli("models", "pull", f"{TINY_REPO}:F16")
    assert plain.returncode == 0, plain.stderr
    path = Path(plain.stdout.strip())
    model = path.read_bytes()
    shutil.rmtree(repo_folder(env))

    result = cli("models", "pull", f"{TINY_REPO}:F16", "--delete-shards")
    assert result.returncode == 0, result.stderr
    assert path.read_bytes() == model  # the same model, whatever was deleted on the way
    said = words(result.stderr)
    deleted = [said.index(f"deleted model-0000{i}-of-00002.safetensors") for i in (1, 2)]
    assert deleted[0] < deleted[1] < said.index("removed the downloaded weights")
    served = hub_with_weights.repos[TINY_REPO]
    shards = [len(f.content) for n, f in served.items() if "-of-" in n]
    # Without: every shard and the whole F16 at once; with: every shard and the F16 of the
    # largest one, so the smaller shard's share of the F16 (its bf16 bytes, and their share
    # of the vocabulary, counted as tokenizer.json's bytes) is saved. The sizes are read
    # back from stderr, which says them to 0.1 MB (the real vocabulary's embedding makes
    # the tiny model's shards tens of MB).
    f16 = sum(shards) + len(served["tokenizer.json"].content)
    assert disk_needed(plain.stderr) - disk_needed(result.stderr) == pytest.approx(
        min(shards) * f16 / sum(shards), abs=100_000
    )


def test_delete_shards_pulls_onto_a_disk_with_room_for_its_lower_peak_only(env, tmp_path):
    """A disk 6 MB above the peak a pull with --delete-shards states, and below a plain
    pull's: the plain pull is refused before any download, the other passes every check
    and writes the model. The layers weigh as much as the embedding here, so the shards
    are 26 and 13 MB and the two peaks about 15 MB apart."""
    folder = tmp_path / "Wide-Qwen2"
    build(folder, sizes={"intermediate_size": 25600})
    with FakeHub() as hub:
        hub.add(TINY_REPO, {p.name: HubFile(p.read_bytes()) for p in sorted(folder.iterdir())})
        use_hub(env, hub, tmp_path / "hf")
        pull = (str(MEMAGENT), "models", "pull", f"{TINY_REPO}:F16")
        roomy = subprocess.run([*pull, "--delete-shards"], capture_output=True, text=True, env=env)
        assert roomy.returncode == 0, roomy.stderr
        model = Path(roomy.stdout.strip()).read_bytes()
        size = int(disk_needed(roomy.stderr)) + 6_000_000
        small = tmp_path / "small"
        env["XDG_DATA_HOME"], env["MEMAGENT_HOME"] = str(small), str(small / "memagent")
        refused = on_a_small_disk(env, small, size, *pull[1:])
        assert_clean_failure(refused, 1, "Not enough disk space")
        assert disk_needed(refused.stderr) > size
        # The refusal names the way out: the flag, and the lower peak it would need.
        lower = re.search(
            r"--delete-shards needs ([\d.]+ (?:bytes|kB|MB|GB))", words(refused.stderr)
        )
        assert lower, refused.stderr
        assert lower[1] == re.search(r"([\d.]+ (?:bytes|kB|MB|GB)) of disk needed", roomy.stderr)[1]
        shard = "model-00001-of-00002.safetensors"
        assert len(hub.downloads(shard)) == 1  # the first pull's: refused before downloading
        kept = tmp_path / "kept"
        kept.mkdir()
        result = on_a_small_disk(env, small, size, *pull[1:], "--delete-shards", keep=kept)
    assert result.returncode == 0, result.stderr
    assert "deleted model-00002-of-00002.safetensors" in words(result.stderr)
    assert (kept / Path(result.stdout.strip()).relative_to(small)).read_bytes() == model


def with_the_quantizer_killed(env, tmp_path, *args: str) -> subprocess.CompletedProcess:
    """`memagent *args` with llama.cpp's quantizer killed as soon as it starts, as the
    kernel's out-of-memory killer would: a quantization that fails once the intermediate
    is written."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen([str(MEMAGENT), *args], stdout=stdout, stderr=stderr, env=env)
        deadline = time.monotonic() + 120
        while process.poll() is None and time.monotonic() < deadline:
            if quantizer := _quantizer(process.pid):
                quantizer.kill()
                break
            time.sleep(0.005)
        process.wait(timeout=120)
    return subprocess.CompletedProcess(args, process.returncode, out.read_text(), err.read_text())


def _quantizer(pid: int):
    """The process running llama.cpp's quantizer for `pid`, once it runs (quantize.py)."""
    import psutil

    for child in psutil.Process(pid).children():
        with contextlib.suppress(psutil.Error):  # gone, or not yet readable
            if any(arg.endswith("_quantize_child.py") for arg in child.cmdline()):
                return child
    return None


@pytest.mark.parametrize("delete_shards", [False, True], ids=["shards kept", "--delete-shards"])
def test_a_pull_whose_quantization_failed_quantizes_its_intermediate_when_run_again(
    cli, env, hub_with_weights, tmp_path, delete_shards
):
    """The intermediate is complete: running again needs room for the model only, downloads
    nothing (with --delete-shards the shards are gone), and removes the intermediate."""
    command = ["models", "pull", f"{TINY_REPO}:Q8_0"]
    command += ["--delete-shards"] if delete_shards else []
    first = with_the_quantizer_killed(env, tmp_path, *command)
    folder = repo_folder(env)
    downloads = folder / "download"
    left = sum(p.stat().st_size for p in downloads.rglob("*") if p.is_file())
    assert_clean_failure(
        first,
        1,
        "llama.cpp could not quantize Tiny-Qwen2.intermediate.BF16 to Q8_0: its process was "
        "killed (SIGKILL)",
        "the same command again quantizes from it without converting again.",
        f"The downloaded weights ({decimal(left)}) stay in {downloads} for the next run; "
        f"`memagent models rm {TINY_REPO}` deletes them",
    )
    intermediate = folder / "Tiny-Qwen2.intermediate.BF16"
    shards = [p.name for p in downloads.glob("*.safetensors")]
    assert intermediate.is_file() and len(shards) == (0 if delete_shards else 2)

    second = cli(*command)
    assert second.returncode == 0, second.stderr
    said = words(second.stderr)
    assert "without downloading the weights again" in said
    assert f"using {intermediate} from an earlier run" in said
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        assert len(hub_with_weights.downloads(shard)) == 1
    model = amount(r"Q8_0 about ([\d.]+) (bytes|kB|MB|GB)", first.stderr)
    assert disk_needed(second.stderr) == model < disk_needed(first.stderr)  # the model only
    assert [p.name for p in folder.iterdir()] == ["Tiny-Qwen2.Q8_0.gguf"]


def test_an_intermediate_goes_after_quantizing_unless_keep_intermediate_marked_it(
    cli, env, tied, tmp_path
):
    """One a failed run left goes once the same command again has used it (it is tens of GB
    for a real model); one kept on request stays for every later type."""
    out = tmp_path / "out"
    out.mkdir()

    def convert(quant: str, *more: str) -> list[str]:
        return [
            "models",
            "convert",
            str(tied[0]),
            "--quant",
            quant,
            "--out",
            str(out / f"m.{quant}.gguf"),
            *more,
        ]

    intermediate = out / "m.intermediate.BF16"
    failed = with_the_quantizer_killed(env, tmp_path, *convert("Q8_0"))
    assert_clean_failure(failed, 1, "its process was killed (SIGKILL)", f"{intermediate} (")
    assert [p.name for p in out.iterdir()] == [intermediate.name]
    again = cli(*convert("Q8_0"))
    assert again.returncode == 0, again.stderr
    assert f"using {intermediate} from an earlier run" in words(again.stderr)
    assert [p.name for p in out.iterdir()] == ["m.Q8_0.gguf"]

    kept = cli(*convert("Q4_0", "--keep-intermediate"))
    assert kept.returncode == 0, kept.stderr
    assert f"kept {intermediate}" in words(kept.stderr)
    later = cli(*convert("Q5_0"))  # without asking again
    assert later.returncode == 0, later.stderr
    assert f"using {intermediate} from an earlier run" in words(later.stderr)
    assert f"kept {intermediate}" in words(later.stderr)
    assert sorted(p.name for p in out.iterdir()) == [
        "m.Q4_0.gguf",
        "m.Q5_0.gguf",
        "m.Q8_0.gguf",
        "m.intermediate.BF16",
        "m.intermediate.BF16.keep",
    ]


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    """163M parameters, 17 times the tiny model: about 330 MB of bf16 weights."""
    folder = tmp_path_factory.mktemp("big") / "Big-Qwen2"
    sizes = {"hidden_size": 512, "intermediate_size": 4096, "num_hidden_layers": 12}
    build(folder, sizes=sizes, dtype="BF16")
    return folder


@pytest.mark.model  # slow: writes and converts a 380 MB model; loads no model into llama.cpp
def test_conversion_memory_stays_flat_as_the_model_grows(tmp_path, tied, big):
    """Peak RSS of `models convert` for the tiny model and for the big one."""
    source = sum(p.stat().st_size for p in big.glob("*.safetensors"))
    assert source > 300e6

    def peak(folder: Path) -> int:
        """The child's peak RSS in bytes, measured by a fresh parent that runs only it."""
        measure = (
            "import resource, subprocess, sys; "
            "subprocess.run(sys.argv[1:], check=True, capture_output=True); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)"
        )
        command = [MEMAGENT, "models", "convert", folder, "--quant", "F16", "--out"]
        command.append(tmp_path / f"{folder.name}.gguf")
        run = subprocess.run(
            [sys.executable, "-c", measure, *map(str, command)], capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        return int(run.stdout)

    small, large = peak(tied[0]), peak(big)
    print(f"peak RSS: {small / 1e6:.0f} MB tiny, {large / 1e6:.0f} MB for {source / 1e6:.0f} MB")
    # The block being converted, not the model (the 152K-token vocabulary is most of both).
    assert large - small < source / 4


SIGNALS = pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"]
)  # Ctrl-C in a terminal, and a service manager or `kill` stopping it


@pytest.mark.model  # slow: see above
@SIGNALS
def test_an_interrupted_conversion_leaves_nothing_that_looks_finished(env, big, tmp_path, sig):
    out = tmp_path / "out"
    out.mkdir()
    command = [MEMAGENT, "models", "convert", big, "--quant", "F16", "--out", out / "m.gguf"]
    process = subprocess.Popen(
        list(map(str, command)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    deadline = time.monotonic() + 30
    while not list(out.iterdir()) and time.monotonic() < deadline:  # writing has begun
        time.sleep(0.05)
    process.send_signal(sig)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + sig and stdout == b"", stderr  # as a shell reports it
    assert b"Traceback" not in stderr
    assert not list(out.iterdir())


@pytest.mark.model  # slow: converts the 380 MB model and quantizes it with llama.cpp
@SIGNALS
def test_a_signal_stops_a_quantization_within_seconds_and_the_same_command_resumes(
    env, big, tmp_path, sig
):
    out = tmp_path / "out"
    out.mkdir()
    part = out / "m.gguf.part"  # what llama.cpp writes into, once the intermediate is done
    command = [MEMAGENT, "models", "convert", big, "--quant", "Q4_K_M", "--out", out / "m.gguf"]
    command = list(map(str, command))
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    deadline = time.monotonic() + 300
    while not part.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)  # well into the tensors
    assert part.exists() and process.poll() is None
    sent = time.monotonic()
    process.send_signal(sig)
    stdout, stderr = process.communicate(timeout=120)
    stopped = time.monotonic() - sent
    said = words(stderr.decode())
    assert process.returncode == 128 + sig and stdout == b"" and "Traceback" not in said
    assert "interrupted while quantizing; nothing of m.gguf was kept" in said
    kept = Path(re.search(r"was kept, and (\S+) \(", said)[1])
    assert [p.name for p in out.iterdir()] == [kept.name]  # no .part: only the intermediate
    print(f"stopped {stopped:.2f} s after {sig.name}")
    if sig != signal.SIGINT:  # what is kept is the same whichever signal stopped it: the
        assert stopped < 3.0, stopped  # resume, a whole quantization, is run once (SIGINT's)
        return

    began = time.monotonic()
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    whole = time.monotonic() - began
    assert again.returncode == 0, again.stderr
    assert f"using {kept} from an earlier run" in words(again.stderr)
    assert [p.name for p in out.iterdir()] == ["m.gguf"]  # not asked to be kept: it went
    # It stopped at once (0.1 s here) where quantizing to the end took 8.6 s from the start.
    assert stopped < min(3.0, whole / 2), (stopped, whole)
    print(f"the whole quantization took {whole:.1f} s")


def test_a_registry_name_with_a_type_pulls_and_finds_that_type(env, hub_with_weights, monkeypatch):
    from memagent_cli import models

    for key in ("HF_ENDPOINT", "XDG_DATA_HOME", "MEMAGENT_HOME"):
        monkeypatch.setenv(key, env[key])
    entry = {"description": "tiny", "hf": f"{TINY_REPO}:Q4_K_M"}
    monkeypatch.setattr(models.registry, "registry", lambda: {"tiny": entry})
    with pytest.raises(ModelError, match="run `memagent models pull tiny:F16`"):
        models.resolve("tiny:F16")
    notes: list[str] = []
    pulled = models.pull("tiny:F16", note=notes.append)
    assert pulled.path == repo_folder(env) / "Tiny-Qwen2.F16.gguf"
    assert any("published as Hugging Face weights" in n for n in notes)
    assert models.resolve("tiny:F16", note=notes.append).path == pulled.path
    with pytest.raises(ModelError, match="memagent models pull tiny"):
        models.resolve("tiny")  # the registry's own type, Q4_K_M, is not there
