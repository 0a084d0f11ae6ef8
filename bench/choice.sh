#!/usr/bin/env bash
# How the default model was chosen, rerun: RULER's single needle (a 7-digit number) at 0%,
# 50% and 100% of a 2K- and an 8K-token haystack, greedy, one model at a time, with the
# peak RSS of each run (docs/development.md, "The default model").
#
#   bench/choice.sh NAME=MODEL [NAME=MODEL ...]
#   bench/choice.sh smollm2=smollm2-135m qwen1.5b=path/to/qwen2.5-coder-1.5b-q4_k_m.gguf
#
# MODEL is anything --model takes. Writes build/bench/choice-NAME.jsonl (one line per case)
# and build/bench/choice-NAME.log (the table, the progress and /usr/bin/time -v), then
# prints one table of them all (bench/choice_table.py).
set -euo pipefail
if [ $# -eq 0 ] || [[ "$1" != *=* ]]; then
    echo "usage: bench/choice.sh NAME=MODEL [NAME=MODEL ...]" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
bin=${BIN:-.venv/bin}
out=build/bench
mkdir -p "$out"
haystack=$out/choice-haystack.txt
# examples/village.py's plain sentences, no fact among them: the haystack the needles hide in.
"$bin/python" examples/village.py 3000 --no-fact --seed 7 >"$haystack"
results=()
for spec in "$@"; do
    name=${spec%%=*}
    model=${spec#*=}
    rm -f "$out/choice-$name.jsonl"
    echo "choice: $name ($model)..." >&2
    status=0
    {
        date -u +"%Y-%m-%d %H:%M UTC"
        "$bin/memagent" --version
        /usr/bin/time -v "$bin/memagent" eval niah --haystack "$haystack" --lengths 2K,8K \
            --depths 3 --chunk-tokens 2000 --memory-tokens 256 --temperature 0 -t 2 \
            --model "$model" --no-reuse --no-trace -o "$out/choice-$name.jsonl"
    } >"$out/choice-$name.log" 2>&1 || status=$?
    if [ "$status" -ne 0 ]; then
        grep -v '^\s' "$out/choice-$name.log" | tail -3 >&2
        echo "choice: $name failed (exit $status); all of it in $out/choice-$name.log" >&2
        exit 1
    fi
    grep -E "Maximum resident|Elapsed" "$out/choice-$name.log" >&2
    results+=("$out/choice-$name.jsonl")
done
"$bin/python" bench/choice_table.py "${results[@]}"
