"""memagent's converter against llama.cpp's own `convert_hf_to_gguf.py`, on a real folder.

Run `python bench/against_llama_convert.py --llama-python PY --converter convert_hf_to_gguf.py
[FOLDER | --random-qwen3]`. The test suite checks memagent's output against the GGUF that
llama.cpp wrote for the test material (tests/test_convert_real.py); this runs llama.cpp's
converter itself, which needs torch and transformers, so it runs in another Python (PY: a
virtual environment with `pip install torch transformers sentencepiece`) and never in the
suite. FOLDER defaults
to the test material's rebuilt Qwen2.5-Coder-0.5B-Instruct (tests/support/qwen_material.py).
`--random-qwen3` instead makes a Qwen3 with random weights, as InfMem-4B's base is shaped
(q/k RMS norms, its own head size, tied embeddings, bf16) but tiny, with `transformers`
itself in PY (`Qwen3ForCausalLM`, seed 0) and the real Qwen2.5 tokenizer (Qwen3's shares
its vocabulary), and compares both converters on it.

Both convert FOLDER to BF16 (llama.cpp: `--outtype bf16`; memagent: `memagent models
convert --quant BF16`). The report says, for every tensor, whether name, type, shape and
bytes are equal, and for every metadata key of either file, whether it is equal; keys that
name the writer or the file (`general.*` but the architecture) are listed apart. It exits
1 when a tensor or another key differs.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support import gguf_files  # noqa: E402

# Keys that describe the file, who wrote it or the sampling it suggests (general.sampling.*,
# from generation_config.json; memagent samples as the protocol says), not the model that runs.
ABOUT_THE_FILE = ("general.",)
KEPT_APART_EXCEPT = {"general.architecture", "general.alignment"}
# What llama.cpp's loader takes when a key is absent, for a BPE ("gpt2") vocabulary
# (src/llama-vocab.cpp: add_eos starts false and only SPM/WPM/UGM types change it).
LOADER_DEFAULTS = {"tokenizer.ggml.add_eos_token": False}


def convert_with_llama(python: str, converter: Path, folder: Path, out: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [python, str(converter), str(folder), "--outtype", "bf16", "--outfile", str(out)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return time.perf_counter() - start


# A tiny Qwen3, written by transformers: the shapes differ from Qwen3-4B's, the layout
# (q_norm/k_norm, head_dim apart from hidden/heads, no q/k/v biases, tied output) does not.
RANDOM_QWEN3 = """
import sys, torch, transformers
folder, vocab = sys.argv[1], int(sys.argv[2])
config = transformers.Qwen3Config(
    vocab_size=vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
    rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    bos_token_id=151643, eos_token_id=151645, torch_dtype="bfloat16",
)
torch.manual_seed(0)
model = transformers.Qwen3ForCausalLM(config).to(torch.bfloat16)
with torch.no_grad():  # transformers starts norms at 1: random ones test them too
    for name, tensor in model.named_parameters():
        if name.endswith("norm.weight"):
            tensor.copy_(1 + 0.1 * torch.randn_like(tensor))
model.save_pretrained(folder, safe_serialization=True)
"""


def random_qwen3(python: str, folder: Path) -> None:
    """A random Qwen3 in `folder`, made by transformers in `python`, with Qwen's tokenizer."""
    import json

    from support import qwen_material

    folder.mkdir(parents=True, exist_ok=True)
    qwen_material.copy_tokenizer(folder)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    ids = [*tokenizer["model"]["vocab"].values(), *(t["id"] for t in tokenizer["added_tokens"])]
    vocab = -(-(max(ids) + 1) // 128) * 128  # padded as Qwen's configs pad it (151,936)
    subprocess.run([python, "-c", RANDOM_QWEN3, str(folder), str(vocab)], check=True)


def convert_with_memagent(folder: Path, out: Path) -> float:
    start = time.perf_counter()
    command = [sys.executable, "-m", "memagent_cli", "models", "convert", str(folder)]
    subprocess.run(
        [*command, "--quant", "BF16", "--out", str(out), "--quiet"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def short(value: object) -> str:
    text = repr(value)
    if isinstance(value, list):
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        return f"list of {len(value):,} (sha256 {digest})"
    return text if len(text) <= 80 else text[:77] + "..."


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, help="a Hugging Face model folder")
    parser.add_argument("--llama-python", required=True, help="a Python with torch, transformers")
    parser.add_argument("--converter", required=True, type=Path, help="convert_hf_to_gguf.py")
    parser.add_argument(
        "--random-qwen3", action="store_true", help="compare on a random Qwen3 transformers makes"
    )
    args = parser.parse_args()
    if not args.converter.is_file():
        sys.exit(f"bench/against_llama_convert.py: no converter at {args.converter}.")
    made = tempfile.TemporaryDirectory()
    if args.random_qwen3:
        args.folder = Path(made.name, "Random-Qwen3")
        random_qwen3(args.llama_python, args.folder)
    elif args.folder is None:
        from support import qwen_material

        args.folder = qwen_material.hf_folder()
    print(f"folder: {args.folder.name}")
    if args.random_qwen3:
        print("  made by transformers.Qwen3ForCausalLM, seed 0, bf16; Qwen2.5's tokenizer")
    # Where the converter came from, not where this machine keeps it.
    print(f"llama.cpp's converter: {'/'.join(args.converter.resolve().parts[-4:])}")
    try:  # also the check that PY runs and has torch and transformers
        versions = subprocess.run(
            [
                args.llama_python,
                "-c",
                "import torch, transformers, sys; "
                "print(f'Python {sys.version.split()[0]}, torch {torch.__version__}, "
                "transformers {transformers.__version__}')",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as error:
        reason = getattr(error, "stderr", "") or str(error)
        sys.exit(
            f"bench/against_llama_convert.py: {args.llama_python} cannot import torch and "
            f"transformers: {reason.strip().splitlines()[-1]}"
        )
    print(f"  run by {versions}")
    print(f"date: {time.strftime('%Y-%m-%d')}")
    with tempfile.TemporaryDirectory() as tmp:
        theirs, ours = Path(tmp, "llama.gguf"), Path(tmp, "memagent.gguf")
        seconds = convert_with_llama(args.llama_python, args.converter, args.folder, theirs)
        print(f"llama.cpp's convert_hf_to_gguf.py --outtype bf16: {seconds:.1f} s")
        seconds = convert_with_memagent(args.folder, ours)
        print(f"memagent models convert --quant BF16: {seconds:.1f} s")
        their_meta, their_tensors = gguf_files.read(theirs)
        our_meta, our_tensors = gguf_files.read(ours)

        differ = []
        same_tensors = 0
        for name in sorted(set(their_tensors) | set(our_tensors)):
            a, b = their_tensors.get(name), our_tensors.get(name)
            if a is None or b is None:
                differ.append(f"tensor {name}: only in {'memagent' if a is None else 'llama.cpp'}")
            elif (a.kind, a.shape) != (b.kind, b.shape):
                differ.append(f"tensor {name}: {a.kind.name} {a.shape} vs {b.kind.name} {b.shape}")
            elif a.raw.tobytes() != b.raw.tobytes():
                differ.append(f"tensor {name}: the same type and shape, other bytes")
            else:
                same_tensors += 1
        print(
            f"tensors: {same_tensors} of {len(their_tensors)} equal bit for bit "
            f"(memagent wrote {len(our_tensors)})"
        )

        same_keys, apart, by_default = 0, [], []
        for key in sorted(set(their_meta) | set(our_meta)):
            a, b = their_meta.get(key, "<absent>"), our_meta.get(key, "<absent>")
            if a == b:
                same_keys += 1
            elif (
                key in LOADER_DEFAULTS
                and their_meta.get("tokenizer.ggml.model") == "gpt2"
                and {a, b} == {"<absent>", LOADER_DEFAULTS[key]}
            ):
                by_default.append(f"  {key}: llama.cpp {short(a)}, memagent {short(b)}")
            elif key.startswith(ABOUT_THE_FILE) and key not in KEPT_APART_EXCEPT:
                apart.append(f"  {key}: llama.cpp {short(a)}, memagent {short(b)}")
            else:
                differ.append(f"key {key}: llama.cpp {short(a)}, memagent {short(b)}")
        print(f"metadata: {same_keys} of {len(set(their_meta) | set(our_meta))} keys equal")
        tokenizer = [k for k in their_meta if k.startswith("tokenizer.")]
        equal = sum(their_meta[k] == our_meta.get(k) for k in tokenizer)
        print(f"  of llama.cpp's {len(tokenizer)} tokenizer.* keys, {equal} equal")
        if by_default:
            print("absent on one side, and the other holds what llama.cpp's loader takes then:")
            print("\n".join(by_default))
        if apart:
            print("keys about the file or its suggested sampling, not the model (not compared):")
            print("\n".join(apart))
    if differ:
        print(f"DIFFERENT ({len(differ)}):")
        print("\n".join(differ))
        return 1
    print("every tensor equal, and every model key equal or equal in effect")
    return 0


if __name__ == "__main__":
    sys.exit(main())
