"""Print a plain-text story whose first sentence holds a password: SENTENCES of about 11
model tokens each (1,800 by default, about 20K tokens). The README's install check:

    python examples/village.py 400 > village.txt
    memagent ask village.txt "What is the secret password for the vault?" \\
        --chunk-tokens 2000 --memory-tokens 128 --temperature 0

`python examples/village.py 3000 --no-fact --seed 7 > haystack.txt` prints sentences with
no password among them: a haystack for `memagent eval niah` (bench/choice.sh's). The tests
build their documents with the same function.
"""

from __future__ import annotations

import argparse
import random

FACT = "The secret password for the vault is PELICAN."


def story(sentences: int, fact: str | None = FACT, seed: int = 1) -> str:
    """Plain sentences (about 11 model tokens each) with `fact` as the first one.

    SmolLM2-135M reliably copies a fact that opens its first chunk into memory and keeps
    it; one planted mid-document is lost. Tests build on what the model can do.
    """
    rng = random.Random(seed)
    subjects = [
        "The old miller",
        "A young sailor",
        "The village baker",
        "Her neighbour",
        "The quiet teacher",
        "A tired farmer",
        "The town clerk",
        "His sister",
    ]
    verbs = [
        "walked to",
        "looked at",
        "painted",
        "cleaned",
        "visited",
        "talked about",
        "repaired",
        "counted the birds near",
    ]
    places = [
        "the stone bridge",
        "the green field",
        "the small harbour",
        "the red barn",
        "the market square",
        "the wooden fence",
        "the long road",
        "the church tower",
    ]
    times = [
        "in the morning",
        "after lunch",
        "before the rain",
        "on Sunday",
        "at dusk",
        "during the fair",
        "in early spring",
        "late at night",
    ]
    lines = [fact] if fact else []
    for _ in range(sentences):
        lines.append(
            f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(places)} {rng.choice(times)}."
        )
    return " ".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sentences", nargs="?", type=int, default=1800)
    parser.add_argument("--no-fact", action="store_true", help="no password sentence")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(story(args.sentences, fact=None if args.no_fact else FACT, seed=args.seed))
