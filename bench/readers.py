"""Each reader on the same document and question, side by side in one run: MemAgent reads
every chunk; ReMemR1 reads every chunk and searches its past memories; InfMem's planner is
made to stop at a known step (a stand-in answers the planner's calls, STOP from that step
on, so the stop is where the bench puts it), while its updates and answer are the model's.

Printed per reader: seconds (median of --runs), chunks read, calls, and the time saved
against reading everything. Then the parts a reader adds to each step, timed in-process:
one real planner call of the model (both thinking stages), BM25 over the document's units
(build and one search), TF-IDF over the memories (one recall).

    python bench/readers.py [--model GGUF] [--stop-at 2] [--runs 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from village import story  # noqa: E402

from memagent_cli import readers  # noqa: E402
from memagent_cli.backend import Generation, Sampling  # noqa: E402
from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions  # noqa: E402
from memagent_cli.chunking import make_chunks, tokenize  # noqa: E402
from memagent_cli.models import resolve  # noqa: E402
from memagent_cli.reader import Settings, read  # noqa: E402
from memagent_cli.readers import infmem, rememr1  # noqa: E402

QUESTION = "What is the secret password for the vault?"


class ForcedPlanner:
    """The model, except that the planner's calls get a fixed reply at no cost: a search
    before step `stop_at`, STOP from it on (three STOPs in a row then end the reading)."""

    def __init__(self, backend: LlamaCppBackend, stop_at: int) -> None:
        self.backend, self.stop_at = backend, stop_at
        self.name, self.planned = backend.name, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def complete(self, raw, *, max_tokens: int, sampling: Sampling) -> Generation:
        text = "".join(piece for piece, _ in raw)
        if "You are a Retrieval Planner" not in text:
            return self.backend.complete(raw, max_tokens=max_tokens, sampling=sampling)
        self.planned += 1
        step = (self.planned - 1) // 2  # two stages per call
        if self.planned % 2:
            return Generation("<think>plan</think>", 0, 0, 0.0, 0.0, "stop")
        call = '✿FUNCTION✿: retrievesearch\n✿ARGS✿: {"query": "vault password", "top_k": 4}'
        return Generation("STOP" if step >= self.stop_at else call, 0, 0, 0.0, 0.0, "stop")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="GGUF [default: the default model]")
    parser.add_argument("--sentences", type=int, default=200, help="document length")
    parser.add_argument("--chunk-tokens", type=int, default=500)
    parser.add_argument("--memory-tokens", type=int, default=64)
    parser.add_argument("--stop-at", type=int, default=2, help="InfMem's planner stops here")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("build/bench/readers.json"))
    args = parser.parse_args()

    found = resolve(args.model)
    backend = LlamaCppBackend(found.path, LlamaOptions(), name=found.name)
    text = story(args.sentences)
    tokens = tokenize(text, backend)
    chunks = make_chunks(tokens, args.chunk_tokens, backend.detokenize, text)
    settings = Settings(args.chunk_tokens, args.memory_tokens, Sampling(0.0))
    widest = Settings(**{**vars(settings), "reader": "infmem"})  # InfMem's calls are longest
    needed = readers.get("infmem").context_needed(backend, [QUESTION], widest)
    backend.prepare(needed)
    print(
        f"{datetime.now(UTC):%Y-%m-%d} · {platform.machine()} · {found.name} · "
        f"{len(tokens)} tokens in {len(chunks)} chunks of {args.chunk_tokens}; "
        f"memory {args.memory_tokens}; greedy; InfMem's planner says STOP from step "
        f"{args.stop_at + 1} on, and it answers at the third"
    )

    rows: dict[str, dict[str, Any]] = {}
    for name in ("memagent", "rememr1", "infmem"):
        seconds, read_chunks = [], 0
        how = Settings(**{**vars(settings), "reader": name})
        for _ in range(args.runs):
            model = ForcedPlanner(backend, args.stop_at) if name == "infmem" else backend
            began = time.perf_counter()
            answer = read(
                model, QUESTION, chunks, how, reader=readers.get(name).loop(backend, tokens)
            )
            seconds.append(time.perf_counter() - began)
            read_chunks = len(answer.steps)
        rows[name] = {
            "seconds": statistics.median(seconds),
            "runs": seconds,
            "chunks_read": read_chunks,
            "chunks": len(chunks),
        }
    whole = rows["memagent"]["seconds"]
    print(f"{'reader':<10}{'median s':>10}{'chunks read':>14}{'vs memagent':>13}")
    for name, row in rows.items():
        print(
            f"{name:<10}{row['seconds']:>10.1f}{row['chunks_read']:>8}/{row['chunks']:<5}"
            f"{row['seconds'] / whole:>12.2f}x"
        )

    # The parts a reader adds to a step.
    state = infmem.State(memory="The vault is in the tower.")
    raw = infmem.raw_chat(
        infmem.render_planner(QUESTION, state.memory, 0, len(chunks), ()), infmem.TOOL_SYSTEM
    )
    began = time.perf_counter()
    first = backend.complete(raw, max_tokens=infmem.THINKING_TOKENS, sampling=Sampling(0.0))
    closed = (*raw, (infmem.closed_thinking(first.text), False))
    second = backend.complete(closed, max_tokens=args.memory_tokens, sampling=Sampling(0.0))
    planner = time.perf_counter() - began
    units = infmem.units([(c.token_start, c.token_end) for c in chunks])
    texts = [
        backend.detokenize(tokens[u.token_start : u.token_end]).decode("utf-8", "replace")
        for u in units
    ]
    began = time.perf_counter()
    index = infmem.BM25.build(texts)
    built = time.perf_counter() - began
    began = time.perf_counter()
    index.search("vault password")
    searched = time.perf_counter() - began
    memories = [f"memory {i}: " + text[:300] for i, text in enumerate(texts)]
    pieces = lambda t: [backend.detokenize([x]) for x in backend.tokenize(t)]  # noqa: E731
    began = time.perf_counter()
    rememr1.top1("vault password", memories, pieces)
    recalled = time.perf_counter() - began
    parts = {
        "planner_call_s": planner,
        "planner_tokens": [first.completion_tokens, second.completion_tokens],
        "bm25_build_s": built,
        "bm25_search_s": searched,
        "units": len(units),
        "tfidf_recall_s": recalled,
        "memories": len(memories),
    }
    print(
        f"one planner call of the model: {planner:.1f} s ({first.completion_tokens} thinking "
        f"+ {second.completion_tokens} reply tokens)"
    )
    print(
        f"BM25 over {len(units)} units: build {built * 1e3:.2f} ms, one search "
        f"{searched * 1e3:.2f} ms; TF-IDF recall over {len(memories)} memories "
        f"{recalled * 1e3:.2f} ms"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"readers": rows, "parts": parts}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
