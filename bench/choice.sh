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
cd "$(dirname "$0")/.."
bin=${BIN:-.venv/bin}
out=build/bench
mkdir -p "$out"
haystack=$out/choice-haystack.txt
# examples/village.py's plain sentences, no fact among them: the haystack the needles hide in.
"$bin/python" -c 'import sys; sys.path.insert(0, "examples"); from village import story
print(story(3000, fact=None, seed=7))' >"$haystack"
results=()
for spec in "$@"; do
    name=${spec%%=*}
    model=${spec#*=}
    rm -f "$out/choice-$name.jsonl"
    echo "choice: $name ($model)..." >&2
    {
        date -u +"%Y-%m-%d %H:%M UTC"
        "$bin/memagent" --version
        /usr/bin/time -v "$bin/memagent" eval niah --haystack "$haystack" --lengths 2K,8K \
            --depths 3 --chunk-tokens 2000 --memory-tokens 256 --temperature 0 -t 2 \
            --model "$model" --no-reuse --no-trace -o "$out/choice-$name.jsonl"
    } >"$out/choice-$name.log" 2>&1
    grep -E "Maximum resident|Elapsed" "$out/choice-$name.log" >&2
    results+=("$out/choice-$name.jsonl")
done
"$bin/python" bench/choice_table.py "${results[@]}"
