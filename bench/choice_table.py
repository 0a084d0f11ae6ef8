"""The table of docs/development.md's "The default model", from bench/choice.sh's files.

Run `python bench/choice_table.py build/bench/choice-NAME.jsonl ...`. For each results file
(and the .log beside it, for /usr/bin/time's peak RSS): sub_em and "needle in the reply"
per length (the authors' scoring counts only a boxed answer; the second column counts the
gold number anywhere in the final reply), how many replies boxed an answer, the median
seconds per case per length, and the peak RSS.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path


def row(results: Path) -> str:
    cases = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    lengths = sorted({case["group"] for case in cases}, key=lambda g: int(g.rstrip("K")))
    per = {g: [case for case in cases if case["group"] == g] for g in lengths}

    def count(test) -> str:
        return " / ".join(f"{sum(map(test, per[g]))} of {len(per[g])}" for g in lengths)

    found = count(lambda c: c["sub_em"] > 0)
    in_reply = count(lambda c: any(gold in (c["reply"] or "") for gold in c["gold"]))
    boxed = f"{sum(case['prediction'] is not None for case in cases)} of {len(cases)}"
    seconds = " / ".join(f"{statistics.median(c['seconds'] for c in per[g]):.0f}" for g in lengths)
    log = results.with_suffix(".log")
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", log.read_text())
    rss = f"{int(peak.group(1)) / 1e6:.2f} GB" if peak else "?"
    model = cases[0]["model"] if cases else "?"
    return f"| {model} | {found} | {in_reply} | {boxed} | {seconds} | {rss} |"


def main() -> None:
    print("| model | sub_em | needle in the reply | boxed | median s per case | peak RSS |")
    print("|---|---|---|---|---|---|")
    for name in sys.argv[1:]:
        print(row(Path(name)))


if __name__ == "__main__":
    main()
