"""The cache of extracted document text, as a user meets it: an encrypted document's text
never lands on disk, the cache keeps to its size limit (least recently used out first),
`memagent cache` shows and clears it, and `--no-document-cache` bypasses it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import builders
from support.fake_openai import served
from support.story import story

STEPS = ["--chunk-tokens", "300", "--memory-tokens", "64", "--temperature", "0"]
CODEWORD = "Zanzibar-Quokka-5521"  # mid-page: the stand-in model copies only a section's start
INSPECT = ["--tokenizer", "tiktoken", "--no-estimate", "--json", "-q"]


def pages(seed: int = 0) -> list[str]:
    return [
        story(25, fact=None, seed=seed) + f" The courier wrote {CODEWORD} on the crate. "
        + story(25, fact=None, seed=seed + 10),
        story(40, fact=None, seed=seed + 20),
    ]  # fmt: skip


def holding(folder: Path, text: str) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def cache_info(cli) -> dict:
    result = cli("cache", "info", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_an_encrypted_pdfs_text_is_nowhere_on_disk_after_ask(memagent, env, fake_server, tmp_path):
    # All of memagent's files in one folder, and its temporary files in another.
    home, temp = tmp_path / "home", tmp_path / "tmp"
    temp.mkdir()
    env.update(MEMAGENT_HOME=str(home), TMPDIR=str(temp))
    # A process: its temporary files go to $TMPDIR, searched below.
    # The codeword opens the document: the stand-in copies a section's first words into its
    # memory, as a model quoting the PDF word for word would.
    opening = [f"{CODEWORD} " + pages()[0], pages()[1]]
    locked = builders.pdf(tmp_path / "locked.pdf", opening, password="pw-1")
    ask = ["ask", str(locked), "Who wrote on the crate?", "--password", "pw-1"]
    result = memagent(*ask, *served(fake_server, *STEPS), "--json")
    assert result.returncode == 0, result.stderr
    memories = [step["memory"] for step in json.loads(result.stdout)["steps"]]
    assert CODEWORD in memories[0]  # the model's output quotes the document
    assert "locked.pdf is encrypted, so no trace is written" in " ".join(result.stderr.split())
    assert holding(tmp_path, CODEWORD) == []  # not the data folder, the cache, nor temp files
    assert cache_info(memagent)["documents"] == 0

    # A trace asked for by name is written, and holds what the model wrote.
    kept = tmp_path / "kept.jsonl"
    named = memagent(*ask, *served(fake_server, *STEPS), "--trace", str(kept), "-q")
    assert named.returncode == 0, named.stderr
    assert holding(tmp_path, CODEWORD) == [kept]

    # The same pages unencrypted are cached, so the search above would have found them.
    plain = builders.pdf(tmp_path / "plain.pdf", pages())
    assert memagent("inspect", str(plain), *INSPECT).returncode == 0
    assert [p.parent.name for p in holding(home, CODEWORD)] == ["documents"]


def test_the_cache_keeps_to_its_limit_dropping_the_least_recently_used(cli, env, tmp_path):
    books = [builders.pdf(tmp_path / f"b{i}.pdf", pages(seed=i)) for i in range(3)]

    def inspect(book: Path) -> str:
        result = cli("inspect", str(book), *INSPECT)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)["document"]["sha256"]

    sha = [inspect(books[0])]
    folder = Path(env["MEMAGENT_HOME"]) / "cache" / "documents"
    one = (folder / f"{sha[0]}.json").stat().st_size  # each book's entry is about this size
    env["MEMAGENT_DOCUMENT_CACHE_BYTES"] = str(int(one * 2.5))  # room for two
    sha.append(inspect(books[1]))
    inspect(books[0])  # b0 used again: b1 is now the one used longest ago
    sha.append(inspect(books[2]))
    info = cache_info(cli)
    assert info["documents"] == 2 and info["bytes"] <= info["limit_bytes"] == int(one * 2.5)
    assert {p.stem for p in folder.glob("*.json")} == {sha[0], sha[2]}

    env["MEMAGENT_DOCUMENT_CACHE_BYTES"] = "0"  # off: nothing kept, not even the old ones
    inspect(books[0])
    assert not list(folder.glob("*.json"))
    env["MEMAGENT_DOCUMENT_CACHE_BYTES"] = "lots"
    bad = cli("cache", "info")
    assert bad.returncode == 1 and "MEMAGENT_DOCUMENT_CACHE_BYTES must be a whole number" in (
        bad.stderr
    )


def test_cache_folder_info_and_clear(cli, env, tmp_path):
    folder = Path(env["MEMAGENT_HOME"]) / "cache" / "documents"
    path = cli("paths", "documents")
    assert path.returncode == 0 and path.stdout == f"{folder}\n"
    book = builders.pdf(tmp_path / "book.pdf", pages())
    assert cli("inspect", str(book), *INSPECT).returncode == 0
    shown = cli("cache", "info")
    assert shown.returncode == 0 and str(folder) in shown.stdout
    assert "documents  1" in shown.stdout and "1.0 GB" in shown.stdout  # the default limit
    cleared = cli("cache", "clear")
    assert cleared.returncode == 0 and cleared.stdout == ""
    assert "deleted 1 cached document" in cleared.stderr and str(folder) in cleared.stderr
    assert not list(folder.glob("*.json")) and holding(folder.parent, CODEWORD) == []
    again = cli("cache", "clear")
    assert again.returncode == 0 and "deleted 0 cached documents" in again.stderr


@pytest.mark.parametrize("command", ["inspect", "ask"])
def test_no_document_cache_neither_reads_nor_writes_it(cli, env, fake_server, tmp_path, command):
    book = builders.pdf(tmp_path / "book.pdf", pages())
    if command == "inspect":
        args = ["inspect", str(book), *INSPECT]
    else:  # --no-reuse: read again rather than answer from the first run's trace
        args = ["ask", str(book), "Who wrote?", *served(fake_server, *STEPS), "-q", "--no-reuse"]

    def read(*more: str) -> str:
        """The document's text as the command read it (for inspect, its length)."""
        before = len(fake_server.messages)
        result = cli(*args, *more)
        assert result.returncode == 0, result.stderr
        if command == "inspect":
            return "x" * json.loads(result.stdout)["document"]["characters"]
        return "".join(fake_server.messages[before:])

    read()  # extracted and cached
    (entry,) = (Path(env["MEMAGENT_HOME"]) / "cache" / "documents").glob("*.json")
    record = json.loads(entry.read_text())
    record["text"] = record["text"].replace(CODEWORD, "Tampered")
    entry.write_text(json.dumps(record))
    tampered, fresh = read(), read("--no-document-cache")
    if command == "inspect":
        assert len(fresh) - len(tampered) == len(CODEWORD) - len("Tampered")
    else:
        assert "Tampered" in tampered and CODEWORD not in tampered
        assert CODEWORD in fresh and "Tampered" not in fresh
    assert "Tampered" in entry.read_text()  # the fresh text was not written back either


def test_a_write_left_by_a_kill_is_counted_then_evicted(cli, env, tmp_path):
    folder = Path(env["MEMAGENT_HOME"]) / "cache" / "documents"
    folder.mkdir(parents=True)
    stale, fresh = folder / ".tmp-killed.json", folder / ".tmp-writing.json"
    stale.write_text("x" * 5000)  # a write that SIGKILL cut, two hours ago
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    fresh.write_text("y" * 300)  # another memagent's write in flight
    info = cache_info(cli)
    assert info["documents"] == 0 and info["bytes"] == 5000  # its disk is counted
    book = builders.pdf(tmp_path / "book.pdf", pages())
    assert cli("inspect", str(book), *INSPECT).returncode == 0  # a write evicts what is stale
    assert not stale.exists() and fresh.exists()
    assert cache_info(cli)["documents"] == 1


def test_a_cache_write_cut_by_sigterm_leaves_no_temporary_file(env, tmp_path):
    """A real process writing entries of 50 MB, stopped by a real SIGTERM mid-write."""
    folder = Path(env["MEMAGENT_HOME"]) / "cache" / "documents"
    writer = (
        "from memagent_cli.cli.options import stop_on_sigterm\n"
        "from memagent_cli.documents import cache\n"
        "from memagent_cli.documents.document import Document\n"
        "stop_on_sigterm()\n"
        "text = 'word ' * 10_000_000\n"
        "for i in range(1000):\n"
        "    cache.store(Document(text=text, path='b.pdf', format='pdf', sha256=f'{i:064x}'))\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", writer], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if folder.is_dir() and any(p.name.startswith(".tmp-") for p in folder.iterdir()):
            break
        time.sleep(0.01)
    time.sleep(0.05)  # well into the write
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert b"Interrupted: SIGTERM" in stderr, stderr  # it was stopped, not finished
    assert [p.name for p in folder.iterdir() if p.name.startswith(".tmp-")] == []


@pytest.mark.parametrize("entry", ["text", "ocr-pages"])
def test_a_fifo_in_an_entrys_place_is_a_miss_at_once(cli, env, tmp_path, entry):
    """The cache folder's files are read as regular files only: a FIFO in an entry's place
    would block the read forever."""
    book = builders.pdf(tmp_path / "book.pdf", pages())
    first = cli("inspect", str(book), *INSPECT)
    sha = json.loads(first.stdout)["document"]["sha256"]
    folder = Path(env["MEMAGENT_HOME"]) / "cache" / "documents"
    if entry == "text":
        (folder / f"{sha}.json").unlink()
        os.mkfifo(folder / f"{sha}.json")
        again = cli("inspect", str(book), *INSPECT, timeout=60)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["document"]["sha256"] == sha  # extracted again
    else:
        os.mkfifo(folder / f"{sha}.ocr-eng.jsonl")
        code = (
            "import sys\nfrom memagent_cli.documents import cache\n"
            f"print(cache.load_pages({sha!r}, 'eng'))\n"
        )
        read = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
        )
        assert read.returncode == 0 and read.stdout == "{}\n", read.stderr


def test_what_is_no_file_in_the_cache_folder_is_neither_counted_nor_stops_eviction(
    cli, env, tmp_path
):
    """A folder or a FIFO named like an entry was counted as a document (and a folder's
    4 kB as its size); `cache clear` said it deleted them, and eviction, which unlinked the
    folder first, stopped at the error and kept the cache over its limit for good."""
    folder = Path(env["MEMAGENT_HOME"]) / "cache" / "documents"
    folder.mkdir(parents=True)
    (folder / ("0" * 64 + ".json")).mkdir()  # sorts first: the oldest-looking "entry"
    os.utime(folder / ("0" * 64 + ".json"), (0, 0))
    os.mkfifo(folder / ("1" * 64 + ".json"))
    (folder / "loop.json").symlink_to(folder / "loop.json")
    assert cache_info(cli)["documents"] == 0 and cache_info(cli)["bytes"] == 0
    assert "deleted 0 cached documents" in cli("cache", "clear").stderr

    books = [builders.pdf(tmp_path / f"b{i}.pdf", pages(seed=i)) for i in range(2)]
    assert cli("inspect", str(books[0]), *INSPECT).returncode == 0
    one = cache_info(cli)["bytes"]
    env["MEMAGENT_DOCUMENT_CACHE_BYTES"] = str(int(one * 1.5))  # room for one
    assert cli("inspect", str(books[1]), *INSPECT).returncode == 0
    info = cache_info(cli)
    assert info["documents"] == 1 and info["bytes"] <= info["limit_bytes"]
