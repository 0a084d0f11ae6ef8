"""The PNG beside bench/reading.py's JSON: one panel per measurement the run made."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(result: dict[str, Any], variants: list[str], path: Path) -> bool:
    """Draw what `result` holds; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = []
    if "copying" in result:
        panels.append(lambda ax: _calls(ax, result["copying"], variants))
    if "engine" in result:
        panels.append(lambda ax: _rates(ax, result["engine"]))
        panels.append(lambda ax: _batch_cost(ax, result["engine"]))
    if "sequence_costs" in result:
        panels.append(lambda ax: _sequence_cost(ax, result["sequence_costs"]))
    if "together" in result:
        panels.append(lambda ax: _together(ax, result["together"]))
    if not panels:
        return False
    columns = min(3, len(panels))
    rows = (len(panels) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 4 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for draw, ax in zip(panels, flat, strict=False):
        draw(ax)
    for ax in flat[len(panels) :]:
        ax.axis("off")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return True


def _calls(ax: Any, case: dict[str, Any], variants: list[str]) -> None:
    for name in variants:
        ax.plot(case[name]["call_seconds"], marker="o", label=name)
    ax.set(title="a copying read: seconds per call (last: answer)", xlabel="call", ylabel="s")
    ax.legend()


def _rates(ax: Any, engine: dict[str, Any]) -> None:
    depths = [r["depth"] for r in engine["rates"]]
    ax.plot(depths, [r["prefill_tps"] for r in engine["rates"]], label="prefill")
    ax.plot(depths, [r["decode_tps"] for r in engine["rates"]], label="decode")
    ax.set(title="engine tokens/s", xlabel="depth", yscale="log")
    ax.legend()


def _batch_cost(ax: Any, engine: dict[str, Any]) -> None:
    ks: list[int] = []
    for depth, table in engine["batch_cost"].items():
        ks = list(table)
        ax.plot(ks, list(table.values()), marker=".", label=f"depth {depth}")
    ax.plot(ks, ks, linestyle=":", color="grey", label="k singles")
    ax.set(title="cost of k tokens in one batch", xlabel="k", ylabel="x one token")
    ax.legend()


def _sequence_cost(ax: Any, costs: dict[str, Any]) -> None:
    qs: list[int] = []
    for depth, table in costs["depths"].items():
        for rows, by_q in table["cost"].items():  # int keys, or str ones read from JSON
            rows, qs = int(rows), [int(q) for q in by_q]
            style = "--" if rows == 1 else "-"
            ax.plot(
                qs,
                list(by_q.values()),
                linestyle=style,
                marker=".",
                label=f"depth {depth}, {rows} row{'s' * (rows > 1)}/seq",
            )
    ax.plot(qs, qs, linestyle=":", color="grey", label="Q rounds alone")
    ax.set(title="cost of Q sequences in one round", xlabel="Q sequences", ylabel="x one sequence")
    ax.legend(fontsize="small")


def _together(ax: Any, together: dict[str, Any]) -> None:
    alone, joint = together["step_seconds_alone"], together["step_seconds_together"]
    calls = range(1, len(alone) + 1)
    width = 0.4
    ax.bar([c - width / 2 for c in calls], alone, width, label="alone, one after another")
    ax.bar([c + width / 2 for c in calls], joint, width, label="together")
    ax.set_xticks(list(calls))
    ax.set(
        title=f"{len(together['questions'])} questions: seconds per step (last: answer)",
        xlabel="call",
        ylabel="s",
    )
    ax.legend()
