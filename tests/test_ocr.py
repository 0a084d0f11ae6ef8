"""Scanned pages read by OCR: pages of real PDFs rendered to images by pypdfium2, turned and
given noise as a scanner would, wrapped as image-only PDFs, and read back through
`load_document` and the `memagent` command."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import builders
from support.command import MEMAGENT, assert_clean_failure

from memagent_cli.documents import load_document
from memagent_cli.documents.ocr import OcrMode, OcrOptions
from memagent_cli.errors import DocumentError, UserError

ROOT = Path(__file__).resolve().parent.parent
ROMAN_THEN_ARABIC = [(0, "/r", "", 1), (2, "/D", "", 1)]  # i, ii, 1, 2, ...


def license_pages(count: int, chars: int = 500) -> list[str]:
    """Pages of body text: paragraphs of the Apache License in this repository."""
    paragraphs = [" ".join(p.split()) for p in (ROOT / "LICENSE").read_text().split("\n\n")]
    paragraphs = [p for p in paragraphs if len(p) > 200 and "http" not in p]
    pages, page = [], ""
    for paragraph in paragraphs:
        page = f"{page}\n{paragraph}" if page else paragraph
        if len(page) >= chars:
            pages.append(page)
            page = ""
        if len(pages) == count:
            return pages
    raise AssertionError("the licence has too few paragraphs")


def text_pdf(path: Path, pages: list[str]) -> bytes:
    """A born-digital PDF of `pages` in 11-point type, as a book is set."""
    from fpdf import FPDF

    doc = FPDF(format="A4")
    doc.set_auto_page_break(False)
    doc.set_font("Helvetica", size=11)
    for text in pages:
        doc.add_page()
        doc.set_xy(20, 20)
        doc.multi_cell(w=120, h=5.5, text=text)
    path.write_bytes(bytes(doc.output()))
    return path.read_bytes()


def layers(data: bytes) -> list[str]:
    from pypdf import PdfReader

    return [page.extract_text() for page in PdfReader(io.BytesIO(data)).pages]


def cer(truth: str, read: str) -> float:
    return builders.character_error_rate(truth, read)


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """Three pages of real body text, born digital."""
    return text_pdf(tmp_path_factory.mktemp("ocr") / "source.pdf", license_pages(3))


@pytest.fixture(scope="module")
def scanned(source: bytes, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`source` scanned: 300 dpi, turned 0.7 degrees, with noise; labelled i, ii, 1."""
    images = builders.scan(source, dpi=300, angle=0.7, noise=18)
    data = builders.image_pdf(images, 300)
    data = builders.mix_pdf([(data, i) for i in range(3)], ROMAN_THEN_ARABIC)
    path = tmp_path_factory.mktemp("ocr") / "scanned.pdf"
    path.write_bytes(data)
    return path


def test_clean_300_dpi_scans_read_within_3_percent(source: bytes, tmp_path: Path) -> None:
    path = tmp_path / "clean.pdf"
    path.write_bytes(builders.image_pdf(builders.scan(source, [0, 1], dpi=300), 300))
    assert all(not text.strip() for text in layers(path.read_bytes()))  # no text layer

    document = load_document(str(path))

    starts = [s.start for s in document.sections] + [len(document.text) + 2]
    pages = [document.text[a : b - 2] for a, b in zip(starts, starts[1:], strict=False)]
    rates = [cer(t, p) for t, p in zip(layers(source)[:2], pages, strict=True)]
    assert max(rates) < 0.03, rates
    assert document.ocr.pages == ["1", "2"] and document.ocr.low_confidence == []
    assert document.ocr.engine.startswith("Tesseract ") and document.ocr.engine.endswith(", eng")
    assert (document.pages, document.pages_without_text, document.ocr.needed) == (2, 0, 2)


def test_turned_noisy_scans_keep_their_labels_and_are_cached_page_by_page(
    scanned: Path, source: bytes, private_cache: Path
) -> None:
    document = load_document(str(scanned))
    again = load_document(str(scanned))

    assert [s.label for s in document.sections] == ["i", "ii", "1"]
    assert document.ocr.pages == ["i", "ii", "1"]
    assert cer("\n".join(layers(source)), document.text) < 0.05
    second = document.sections[1].start
    assert document.span(second, second + 10) == "p. ii"
    assert again.from_cache and again.text == document.text and again.ocr == document.ocr
    [pages] = private_cache.rglob("*.ocr-eng.jsonl")  # one line per page, private
    assert len(pages.read_text().splitlines()) == 3
    assert pages.stat().st_mode & 0o777 == 0o600
    with pytest.raises(DocumentError, match="no text layer"):  # never: not the OCR'd entry
        load_document(str(scanned), ocr=OcrOptions(OcrMode.never))


def test_a_pdf_mixing_text_and_scanned_pages(source: bytes, tmp_path: Path) -> None:
    """Text pages keep their own layer word for word; the scanned page between them is OCR's,
    under its own label."""
    scan = builders.image_pdf(builders.scan(source, [1], dpi=300, angle=-0.5, noise=12), 300)
    data = builders.mix_pdf([(source, 0), (scan, 0), (source, 2)], ROMAN_THEN_ARABIC)
    path = tmp_path / "mixed.pdf"
    path.write_bytes(data)

    document = load_document(str(path))

    truth = layers(source)
    assert [s.label for s in document.sections] == ["i", "ii", "1"]
    assert document.ocr.pages == ["ii"] and document.ocr.needed == 1
    first, second, third = (document.sections[i].start for i in range(3))
    assert document.text[first : second - 2] == truth[0].strip()
    assert document.text[third:] == truth[2].strip()
    assert cer(truth[1], document.text[second : third - 2]) < 0.03


def test_always_reads_every_page_over_a_garbage_text_layer(source: bytes, tmp_path: Path):
    """A text layer that is not what the page shows (a bad OCR layer, a broken font map) is
    kept by --ocr auto and replaced by --ocr always."""
    from fpdf import FPDF
    from fpdf.enums import TextMode
    from pypdf import PdfReader, PdfWriter

    scan = builders.image_pdf(builders.scan(source, [0], dpi=300), 300)
    garbage = FPDF(format="A4")
    garbage.add_page()
    garbage.set_font("Helvetica", size=11)
    garbage.text_mode = TextMode.INVISIBLE  # as an OCR layer sits under a scan
    garbage.text(20, 20, "Xq#v Zpp@ lorem kkk 0o0o")
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(scan)))
    writer.pages[0].merge_page(PdfReader(io.BytesIO(bytes(garbage.output()))).pages[0])
    path = tmp_path / "bad-layer.pdf"
    with open(path, "wb") as file:
        writer.write(file)

    kept = load_document(str(path))
    redone = load_document(str(path), ocr=OcrOptions(OcrMode.always))

    assert "Xq#v" in kept.text and kept.ocr.pages == [] and not kept.ocr.engine
    assert "Xq#v" not in redone.text and redone.ocr.pages == ["1"]
    assert cer(layers(source)[0], redone.text) < 0.03


def test_never_refuses_a_scan_and_names_the_option(scanned: Path) -> None:
    with pytest.raises(DocumentError, match=r"no text layer on any of its 3 pages.*--ocr auto"):
        load_document(str(scanned), ocr=OcrOptions(OcrMode.never))


def test_languages_are_named_as_tesseract_names_them() -> None:
    assert OcrOptions(languages="en,de").codes() == ["eng", "deu"]
    assert OcrOptions(languages="eng+chi_sim").key() == "eng+chi_sim"
    with pytest.raises(UserError, match="--ocr-lang names no language"):
        OcrOptions(languages=" + ").codes()


def test_a_language_without_data_is_one_sentence(scanned: Path) -> None:
    with pytest.raises(DocumentError, match=r"^OCR has no data for xyz here: install it with"):
        load_document(str(scanned), ocr=OcrOptions(languages="eng+xyz"))


@pytest.mark.parametrize("damage", ["cut", "noise"])
def test_damaged_language_data_is_one_sentence(memagent, env, scanned, tmp_path, damage):
    """An eng.traineddata cut short by a failed copy, or not one at all: Tesseract refuses to
    start, in each OCR thread, and that was a traceback from the thread."""
    from memagent_cli.documents.ocr import tessdata_folders

    folders = [f for f in tessdata_folders() if (f / "eng.traineddata").is_file()]
    good = folders[0] / "eng.traineddata"
    folder = tmp_path / "tessdata"
    folder.mkdir()
    data = good.read_bytes()[:100_000] if damage == "cut" else bytes(range(256)) * 40
    (folder / "eng.traineddata").write_bytes(data)
    env["TESSDATA_PREFIX"] = str(folder)

    result = memagent("inspect", str(scanned), "--text", timeout=60)

    assert_clean_failure(result, 1, f"{folder / 'eng.traineddata'}", "cannot be loaded")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_an_encrypted_scan_is_read_and_nothing_of_it_is_cached(
    source: bytes, tmp_path: Path, private_cache: Path
) -> None:
    from pypdf import PdfReader, PdfWriter

    scan = builders.image_pdf(builders.scan(source, [0], dpi=300, angle=0.4, noise=10), 300)
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(scan)))
    writer.encrypt("s3cret", algorithm="AES-256")
    path = tmp_path / "locked.pdf"
    with open(path, "wb") as file:
        writer.write(file)

    document = load_document(str(path), password="s3cret")

    assert document.encrypted and document.ocr.pages == ["1"]
    assert cer(layers(source)[0], document.text) < 0.03
    assert not list(private_cache.rglob("*.json*"))


def test_without_the_ocr_extra_a_scan_says_how_to_install_it(cli, scanned: Path, monkeypatch):
    """None in sys.modules is how Python itself refuses an import: `import tesserocr` raises
    ImportError, as where the extra is not installed."""
    monkeypatch.setitem(sys.modules, "tesserocr", None)

    result = cli("inspect", str(scanned), "--text")

    # memagent is not on PyPI: the way in is its checkout's (docs/install.md).
    assert_clean_failure(result, 1, "make install-ocr")
    assert "memagent[ocr]" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_inspect_text_prints_each_page_under_its_label(cli, source: bytes, tmp_path: Path):
    scan = builders.image_pdf(builders.scan(source, [1], dpi=300), 300)
    path = tmp_path / "mixed.pdf"
    path.write_bytes(builders.mix_pdf([(source, 0), (scan, 0)], ROMAN_THEN_ARABIC))

    result = cli("inspect", str(path), "--text")

    assert result.returncode == 0, result.stderr
    pages = result.stdout.split("\f")
    assert pages[-1] == ""  # every page ends with a form feed, as pdftotext ends them
    assert pages[0].startswith("==> p. i <==\n") and pages[1].startswith("==> p. ii (OCR) <==\n")
    assert pages[0].removeprefix("==> p. i <==\n").strip() == layers(source)[0].strip()
    as_json = json.loads(cli("inspect", str(path), "--text", "--json").stdout)
    assert [(p["label"], p["ocr"]) for p in as_json] == [("p. i", False), ("p. ii", True)]


def test_inspect_counts_the_pages_for_ocr_and_estimates_the_time(cli, scanned: Path):
    report = json.loads(cli("inspect", str(scanned), "--tokenizer", "tiktoken", "--json").stdout)

    document = report["document"]
    assert document["pages_needing_ocr"] == 3
    assert document["ocr"]["pages"] == ["i", "ii", "1"]
    assert document["ocr"]["engine"].startswith("Tesseract")
    estimate = report["ocr_estimate"]
    assert estimate["pages"] == 3 and estimate["seconds"] > 0
    table = cli("inspect", str(scanned), "--tokenizer", "tiktoken").stdout
    assert "3 read by OCR" in table and "of OCR on" in table


def test_inspect_with_ocr_never_counts_and_estimates_without_reading(cli, scanned: Path):
    """docs/ocr.md: `--ocr never` gives the count and the estimate without reading the pages,
    so a scan's cost is known before any OCR; `ask` still refuses it, naming --ocr auto."""
    result = cli("inspect", str(scanned), "--tokenizer", "tiktoken", "--ocr", "never", "--json")

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["document"]["pages_needing_ocr"] == 3
    assert report["document"]["ocr"] is None and report["tokens"] == 0  # none read
    assert report["ocr_estimate"]["pages"] == 3 and report["ocr_estimate"]["seconds"] > 0
    assert "3 of 3 pages have no text layer" in result.stderr and "--ocr auto" in result.stderr
    table = cli("inspect", str(scanned), "--tokenizer", "tiktoken", "--ocr", "never")
    assert table.returncode == 0 and "of OCR on" in table.stdout, table.stderr
    asked = cli("ask", str(scanned), "Who?", "-m", "nope.gguf", "--ocr", "never")
    assert_clean_failure(asked, 1, "no text layer on any of its 3 pages", "--ocr auto")


@pytest.mark.model
@pytest.mark.usefixtures("on_tiny_model")
def test_inspect_with_ocr_never_counts_with_the_models_tokenizer(cli, scanned: Path):
    """The same with the model's tokenizer: no chunk to time, so no warm-up (it took the
    first chunk's text, and there is none)."""
    result = cli("inspect", str(scanned), "--ocr", "never", "--json")

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["tokenizer"]["kind"] == "model" and report["tokens"] == 0
    assert report["estimate"] is None and report["ocr_estimate"]["pages"] == 3


def test_a_low_confidence_page_is_named_on_stderr(source: bytes, cli, tmp_path: Path):
    """A page scanned at 50 dpi: Tesseract reads it with 12-17% of its characters wrong,
    and says it is unsure (confidence about 62); the clean page is not named."""
    clean = builders.image_pdf(builders.scan(source, [0], dpi=300), 300)
    poor = builders.image_pdf(builders.scan(source, [1], dpi=50), 50)
    path = tmp_path / "poor.pdf"
    path.write_bytes(builders.mix_pdf([(clean, 0), (poor, 0)]))

    result = cli("inspect", str(path), "--text")

    assert result.returncode == 0, result.stderr
    assert "OCR is unsure of p. 2 of" in result.stderr and "p. 1 " not in result.stderr


def test_ctrl_c_and_a_rerun_go_on_from_the_next_page(env, source: bytes, tmp_path: Path):
    """Each recognized page is cached as it is done: after Ctrl-C, a rerun reads only the
    pages not done, and reads them as an uninterrupted run does."""
    images = builders.scan(source, [0, 1, 2, 0], dpi=200)
    path = tmp_path / "long.pdf"
    path.write_bytes(builders.image_pdf(images, 200))
    cached = Path(env["MEMAGENT_HOME"]) / "cache"
    command = [str(MEMAGENT), "inspect", str(path), "--text"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not [p for p in cached.rglob("*.jsonl") if p.read_text()]:
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    assert process.wait(60) == 130
    [done] = cached.rglob("*.jsonl")
    before = [json.loads(line)[0] for line in done.read_text().splitlines()]
    assert 1 <= len(before) < 4

    rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)

    assert rerun.returncode == 0, rerun.stderr
    after = [json.loads(line)[0] for line in done.read_text().splitlines()]
    assert after[: len(before)] == before and sorted(after) == [0, 1, 2, 3]  # none twice
    pages = rerun.stdout.split("\f")[:-1]
    assert [p.splitlines()[0] for p in pages] == [f"==> p. {n} (OCR) <==" for n in range(1, 5)]
    truths = [layers(source)[i] for i in (0, 1, 2, 0)]
    assert all(cer(t, p.split("\n", 1)[1]) < 0.03 for t, p in zip(truths, pages, strict=True))


def test_always_leaves_a_damaged_page_to_the_damage_note(tmp_path: Path) -> None:
    path = builders.pdf(tmp_path / "a.pdf", ["Page one has text.", "Page two has text."])
    builders.corrupt_page_streams(path, [1], builders.scramble)

    document = load_document(str(path), ocr=OcrOptions(OcrMode.always))

    assert document.ocr.pages == ["1"] and document.pages_without_text == 0
    assert "Page one has text." in document.text
    assert [n.split(":")[0] for n in document.notes] == [f"{path} is damaged"]


@pytest.mark.parametrize("missing", ["the OCR extra", "a language's data"])
def test_a_pdf_read_without_ocr_is_cached_until_ocr_can_run(
    source: bytes, tmp_path: Path, monkeypatch, missing: str
) -> None:
    """A book with one image-only page (a cover), read where OCR cannot run: its text pages
    are read with a note, cached, and found in the cache by the next command, until OCR
    can read that page."""
    scan = builders.image_pdf(builders.scan(source, [1], dpi=300), 300)
    path = tmp_path / "covered.pdf"
    path.write_bytes(builders.mix_pdf([(scan, 0), (source, 0), (source, 2)]))
    options = OcrOptions(languages="eng+xyz") if missing != "the OCR extra" else OcrOptions()
    with monkeypatch.context() as unavailable:
        if missing == "the OCR extra":
            unavailable.setitem(sys.modules, "tesserocr", None)
        first = load_document(str(path), ocr=options)
        second = load_document(str(path), ocr=options)

    assert not first.from_cache and first.ocr.pages == [] and first.pages_without_text == 1
    assert second.from_cache and second.notes == first.notes and second.text == first.text
    if missing == "the OCR extra":  # installed since: the cover is read now
        third = load_document(str(path), ocr=options)
        assert not third.from_cache and third.ocr.pages == ["1"]


def test_a_page_line_cut_by_a_power_loss_is_dropped_before_the_next_page(
    source: bytes, tmp_path: Path
) -> None:
    """A power loss can leave the page cache ending mid-line. The next page recognized is
    appended after the last whole line, not glued to the cut one (and lost with it)."""
    import hashlib

    from memagent_cli.documents import cache

    path = tmp_path / "two.pdf"
    path.write_bytes(builders.image_pdf(builders.scan(source, [0, 1], dpi=200), 200))
    sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    cache.store_page(sha256, "eng", 0, "The first page.", 95.0)
    pages = next(cache.directory().glob(f"{sha256}.ocr-eng.jsonl"))
    pages.write_text(pages.read_text() + '[1, "The second pa')  # cut by the power loss

    document = load_document(str(path))

    assert document.ocr.pages == ["1", "2"] and "The first page." in document.text
    assert sorted(cache.load_pages(sha256, "eng")) == [0, 1]
    assert all(json.loads(line) for line in pages.read_text().splitlines())


def test_pages_whose_labels_repeat_are_told_apart(cli, source: bytes, tmp_path: Path):
    """Numbering that starts again (a front matter "1", then the body's "1"): the page read
    by OCR, and the page OCR is unsure of, are named so that only one page fits."""
    poor = builders.image_pdf(builders.scan(source, [1], dpi=50), 50)
    path = tmp_path / "restarted.pdf"
    path.write_bytes(
        builders.mix_pdf(
            [(poor, 0), (source, 0), (source, 1)], [(0, "/D", "", 1), (1, "/D", "", 1)]
        )
    )

    result = cli("inspect", str(path), "--text", "--json")

    assert result.returncode == 0, result.stderr
    pages = [(p["label"], p["ocr"]) for p in json.loads(result.stdout)]
    assert [ocr for _, ocr in pages] == [True, False, False]
    assert len({label for label, _ in pages}) == 3, pages
    assert f"OCR is unsure of {pages[0][0]} of " in result.stderr
    assert pages[1][0] not in result.stderr
