"""Scoring exactly as the authors' `taskutils/memory_eval/ruler_hqa.py` and
`ruler_general.py` (MemAgent, Apache-2.0), quirks included, so numbers compare with the paper.

What the authors do with a final reply:
- `response = reply.strip()`; if it holds `</think>`, the part after the last one (stripped)
  is read, else the whole response (`utils.extract_solution`);
- the prediction is the content of the last `\\boxed` there (`utils.extract_boxed_answer`:
  the last `\\boxed` occurrence, braces matched from it; `\\boxed ` with a space up to the
  next `$`; `\\fbox{}` when there is no `\\boxed`). No box, or an empty one: every score is 0.
- QA (`answers`, gold `answers[0]`): sub_em (either normalized string contains the other;
  the paper's "accuracy"), em and SQuAD's f1, each rounded to 2 decimals per case
  (`calc_metrics` on one case);
- needle files (`outputs`): the fraction of expected values found in the prediction,
  ignoring case (RULER's `string_match_all`), also rounded to 2 decimals.

`protocol.normalize_answer` is the authors' normalize_answer (same steps, same order).
`protocol.extract_boxed` (what `ask` prints) differs only when the last box is unclosed (it
falls back to an earlier box; the authors score 0) and for `\\boxed ` / `\\fbox`, so the
authors' extraction lives here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from memagent_cli.protocol import needle_recall, normalize_answer


@dataclass(frozen=True)
class Score:
    """One case's scores; em and f1 are None for needle cases (the authors score only
    recall there, reported as sub_em)."""

    prediction: str | None
    sub_em: float
    em: float | None
    f1: float | None


def score_reply(reply: str, answers: Sequence[str], kind: str) -> Score:
    """Score a final reply against a case's answers as the authors do."""
    prediction = prediction_of(reply)
    if kind == "needle":
        recall = round(needle_recall(prediction, list(answers)), 2) if prediction else 0.0
        return Score(prediction, recall, None, None)
    if not prediction:
        return Score(prediction, 0.0, 0.0, 0.0)
    gold = answers[0]
    return Score(
        prediction,
        float(sub_em(prediction, gold)),
        float(exact_match(prediction, gold)),
        round(f1_score(prediction, gold), 2),
    )


def prediction_of(reply: str) -> str | None:
    """The authors' prediction: the last boxed content of the answer part of the reply."""
    response = reply.strip()
    after_think = response.split("</think>")[-1].strip() if "</think>" in response else response
    return boxed_answer(after_think) if after_think else boxed_answer(response)


def boxed_answer(text: str) -> str | None:
    """The authors' `extract_boxed_answer`: content of the last `\\boxed`, or None."""
    if "\\boxed " in text:
        return text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                opening = text.find("{", start)
                # The authors assert the box reads `\boxed{...}`; `\fbox{...}` fails that
                # assertion and their run stops, so it scores nothing here.
                if not text.startswith("\\boxed{", start):
                    return None
                return text[opening + 1 : i]
    return None


def sub_em(prediction: str, gold: str) -> bool:
    """Either normalized string contains the other. As the authors' code, an answer that
    normalizes to nothing (say "The.") counts as contained: only a missing or empty box
    scores 0."""
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    return ref in pred or pred in ref


def exact_match(prediction: str, gold: str) -> bool:
    """SQuAD's exact match: equal after normalization."""
    return normalize_answer(prediction) == normalize_answer(gold)


def f1_score(prediction: str, gold: str) -> float:
    """SQuAD's token f1 as HotpotQA computes it: yes/no/noanswer must match exactly."""
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if (pred in ("yes", "no", "noanswer") or ref in ("yes", "no", "noanswer")) and pred != ref:
        return 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    same = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)
