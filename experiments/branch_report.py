"""The "Branching" section of docs/reproduction.md: table and figure per parent run."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import altair as alt
import pandas as pd

from experiments.figures import save_png

__all__ = ["chart", "render"]


def _g(x: float | None) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.3g}"


def _iv(value: float | None, lo: float | None, hi: float | None) -> str:
    if value is None:
        return "–"
    return f"{_g(value)} [{_g(lo) if lo is not None else '?'}–{_g(hi) if hi is not None else '?'}]"


def _local_cell(local: Any) -> str:
    if local is None:
        return "missing branches"
    if local.b_crit is None and local.b_crit_hi is not None:
        return f"between {_g(local.b_crit_lo)} and {_g(local.b_crit_hi)} (not resolved)"
    if local.b_crit is None:
        return f"> {_g(local.b_crit_lo)}"
    return _iv(local.b_crit, local.b_crit_lo, local.b_crit_hi)


def _ratio(a: float | None, b: float | None) -> str:
    return "–" if a is None or b is None or b <= 0 else f"{a / b:.2g}"


def _verdict(point: Any) -> str:
    """Where B_simple's interval lies against the local measurement's."""
    local, bs = point.sweep.local, point.b_simple
    if local is None or bs is None:
        return "–"
    if local.b_crit is None and local.b_crit_hi is None:
        return "below" if bs.hi < local.b_crit_lo else "not comparable (local is a lower bound)"
    lo, hi = local.b_crit_lo or 0.0, local.b_crit_hi or math.inf
    if bs.hi < lo:
        return "below"
    if bs.lo > hi:
        return "above"
    return "overlap"


def chart(res: Any) -> alt.LayerChart:
    """B_simple along the parent run (band), local B_crit at branch points, sweep B_crit at the
    parent's loss; one y axis, in the task's units."""
    units = res.spec.units
    curve = pd.DataFrame(
        [{"step": max(s, 1), "value": v, "lo": lo, "hi": hi} for s, v, lo, hi in res.b_simple_curve]
    )
    marks = []
    for p in res.points:
        local = p.sweep.local
        if local is not None and local.b_crit is not None:
            marks.append(
                {
                    "step": max(p.step, 1),
                    "value": local.b_crit,
                    "lo": local.b_crit_lo if local.b_crit_lo is not None else local.b_crit,
                    "hi": local.b_crit_hi if local.b_crit_hi is not None else local.b_crit,
                    "what": "local B_crit (branches, 90%; open ends to the top)",
                }
            )
        elif local is not None and local.b_crit_hi is not None:
            marks.append(
                {
                    "step": max(p.step, 1),
                    "value": math.sqrt(local.b_crit_lo * local.b_crit_hi),
                    "lo": local.b_crit_lo,
                    "hi": local.b_crit_hi,
                    "what": "local B_crit: between two batch sizes (grid does not resolve it)",
                }
            )
        elif local is not None:
            marks.append(
                {
                    "step": max(p.step, 1),
                    "value": local.b_crit_lo,
                    "lo": local.b_crit_lo,
                    "hi": local.b_crit_lo,
                    "what": "local B_crit: lower bound (all within ε)",
                }
            )
        if p.global_b_crit is not None:
            f = p.global_b_crit
            marks.append(
                {
                    "step": max(p.step, 1),
                    "value": f.b_crit,
                    "lo": f.b_crit_lo,
                    "hi": f.b_crit_hi,
                    "what": "sweep B_crit at this loss"
                    + (" (extrapolated)" if f.extrapolation else "")
                    + ", 90%",
                }
            )
    marks_df = pd.DataFrame(marks)
    if not marks_df.empty:
        # An open upper end (above the largest batch tried) is drawn to the top of the chart.
        top = 3 * max(
            [*marks_df["value"], *marks_df["hi"].dropna(), *curve.get("hi", pd.Series()).dropna()]
        )
        open_end = [
            p.sweep.local is not None and p.sweep.local.b_crit_hi is None for p in res.points
        ]
        for i, row in marks_df.iterrows():
            if (
                row["what"].startswith("local")
                and open_end[[max(p.step, 1) for p in res.points].index(row["step"])]
            ):
                marks_df.loc[i, "hi"] = top
    x = alt.X("step:Q", scale=alt.Scale(type="log"), title="parent step")
    y = alt.Y("value:Q", scale=alt.Scale(type="log"), title=f"batch size ({units})")
    layers: list[alt.Chart] = []
    if not curve.empty:
        layers.append(
            alt.Chart(curve).mark_area(opacity=0.2, color="gray").encode(x=x, y="lo:Q", y2="hi:Q")
        )
        layers.append(alt.Chart(curve).mark_line(color="gray").encode(x=x, y=y))
    if not marks_df.empty:
        color = alt.Color("what:N", title=None, legend=alt.Legend(orient="bottom", labelLimit=0))
        layers.append(alt.Chart(marks_df).mark_rule().encode(x=x, y="lo:Q", y2="hi:Q", color=color))
        layers.append(
            alt.Chart(marks_df)
            .mark_point(filled=True, size=60)
            .encode(x=x, y=y, color=color, shape=alt.Shape("what:N", legend=None))
        )
    return cast(alt.LayerChart, alt.layer(*layers)).properties(
        width=420,
        height=260,
        title=f"{res.setup.key}: B_simple (gray, parent run, 90% band) vs measured B_crit",
    )


DISCUSSION_FILE = Path(__file__).with_name("branching_discussion.md")


def _summary(results: Sequence[Any]) -> list[str]:
    """Per setting: how B_simple's interval lies against the local and the sweep measurement."""
    lines = [
        "| setting | B_simple vs local B_crit (overlap / below / above / no comparison) | "
        "B_simple vs sweep B_crit at the same loss | local vs sweep |",
        "|---|---|---|---|",
    ]
    for res in results:
        local_counts = {"overlap": 0, "below": 0, "above": 0, "other": 0}
        sweep_counts = dict(local_counts)
        pair_counts = dict(local_counts)
        for p in res.points:
            v = _verdict(p)
            local_counts[v if v in local_counts else "other"] += 1
            f, bs, lc = p.global_b_crit, p.b_simple, p.sweep.local
            sweep_counts[_compare(bs and (bs.lo, bs.hi), f and (f.b_crit_lo, f.b_crit_hi))] += 1
            local_iv = (
                lc
                and (lc.b_crit is not None or lc.b_crit_hi is not None)
                and (
                    lc.b_crit_lo,
                    lc.b_crit_hi,
                )
            )
            pair_counts[_compare(local_iv, f and (f.b_crit_lo, f.b_crit_hi))] += 1

        def cell(c: dict[str, int]) -> str:
            return f"{c['overlap']} / {c['below']} / {c['above']} / {c['other']}"

        lines.append(
            f"| {res.setup.key} | {cell(local_counts)} | {cell(sweep_counts)} | "
            f"{cell(pair_counts)} |"
        )
    return lines


def _compare(a: Any, b: Any) -> str:
    """ "below"/"above" when interval ``a`` lies wholly below/above ``b``, else "overlap";
    "other" when either is missing."""
    if not a or not b:
        return "other"
    a_lo, a_hi = a[0] or 0.0, a[1] if a[1] is not None else math.inf
    b_lo, b_hi = b[0] or 0.0, b[1] if b[1] is not None else math.inf
    if a_hi < b_lo:
        return "below"
    if a_lo > b_hi:
        return "above"
    return "overlap"


def render(results: Sequence[Any], docs: Path, command: str) -> str:
    lines = [
        "## Branching: the local critical batch size (issue 23)",
        "",
        "Written by",
        "",
        f"    {command}",
        "",
        "From one parent run per setting, at 4 branch points, `noisescope.branch` trains short "
        "continuations at the parent's batch size times each multiplier, each on the same "
        "budget of examples (tokens), the learning rate rescaled by the stated rule, with 3 "
        "paired data seeds; the *local* critical batch size is where the mean loss after the "
        "budget crosses (1 + ε) times the smallest batch's (interpolated in log B; 90% interval "
        "from the seeds' paired differences, never narrower than the grid cell around the "
        "crossing; *between b and b'* where the grid does not resolve it: the crossing in the "
        "first cell, or a jump across its cell of more than 4x the step before; "
        "`noisescope.estimators.local_critical_batch`; "
        'docs/science.md, "Measuring the critical batch size directly (branching)"). '
        "B_simple is the parent run's own measurement over steps s ± max(s/4, 32) (block "
        'jackknife, 90%; "not measurable" where |G|² is not significantly above zero '
        "there). The sweep's B_crit at the parent's loss comes from the task's sweep "
        "(`python -m experiments`, same cache) through the fit B_crit(L) = B*·L^(−1/α_B) "
        "across its targets (`noisescope.forecast`), marked *extrapolated* when the parent's "
        "loss lies outside the sweep's targets. The sweep's B_crit is a *global* quantity (the "
        "steps-vs-examples trade-off to reach a loss from initialisation, lr tuned per batch), "
        "the branch measurement a *local* one (this state, this lr rule, this budget, this ε): "
        "they need not agree. All in the task's units; every branch is a run on the server, "
        "linked to its parent and branch step (`GET /api/v1/runs/{id}/branches`).",
        "",
    ]
    for res in results:
        s = res.setup
        fig = f"figures/branching_{s.key}.png"
        save_png(chart(res), docs / fig)
        law = res.law
        law_text = (
            f"B* = {_g(law.b_star)}, α_B = {_g(law.alpha_b)} "
            f"[{_g(law.alpha_b_lo)}–{_g(law.alpha_b_hi)}], {res.law_note}"
            if law is not None and law.alpha_b is not None
            else (law.reason if law is not None else res.law_note)
        )
        n_branches = sum(len(p.sweep.results) for p in res.points)
        lines += [
            f"### {s.key} ({res.spec.title})",
            "",
            f"Parent: batch {s.batch_size} {res.spec.units}, lr {s.lr:g} ({res.spec.optimizer}), "
            f"{s.steps} steps. Branches: multipliers {', '.join(map(str, s.multipliers))}, "
            f"lr rule `{s.lr_rule}`, budget {s.budget:,} {res.spec.units}, {s.seeds} seeds, "
            f"ε = {s.epsilon:g}; {n_branches} branch runs. Cost: the branches process "
            f"{n_branches * s.budget / s.batch_size / len(res.points):.0f} parent steps' worth "
            f"of {res.spec.units} per branch point ({len(s.multipliers) * s.seeds} × the "
            f"budget). This invocation: {res.minutes:.1f} min wall clock (parent run, "
            f"{sum(p.sweep.reused for p in res.points)} of {n_branches} branches reused from "
            "the store, the sweep from its cache when there). Sweep law: " + law_text + ".",
            "",
            "| step | loss | local B_crit [90%] | B_simple [90%] | sweep B_crit at this loss "
            "[90%] | B_simple / local | B_simple vs local |",
            "|---|---|---|---|---|---|---|",
        ]
        for p in res.points:
            local = p.sweep.local
            bs = p.b_simple
            f = p.global_b_crit
            sweep_cell = (
                "–"
                if f is None
                else _iv(f.b_crit, f.b_crit_lo, f.b_crit_hi)
                + (" (extrapolated)" if f.extrapolation else "")
            )
            lines.append(
                f"| {p.step} | {p.loss:.3g} | {_local_cell(local)} | "
                + (_iv(bs.value, bs.lo, bs.hi) if bs is not None else "not measurable")
                + f" | {sweep_cell} | "
                + _ratio(bs.value if bs else None, local.b_crit if local else None)
                + f" | {_verdict(p)} |"
            )
        plateau = res.plateau
        lines += [
            "",
            "Plateau of the local critical batch size (`noisescope.forecast.plateau`): "
            + (
                f"from step {plateau.step} (local B_crit "
                + (
                    _g(plateau.b_crit)
                    if plateau.b_crit is not None
                    else f"between {_g(plateau.b_crit_lo)} and {_g(plateau.b_crit_hi)}"
                )
                + ")."
                if plateau.step is not None
                else f"none found ({plateau.reason})."
            ),
            "",
            f"![{s.key}]({fig})",
            "",
        ]
    lines += [
        "### Where B_simple tracks the local and the sweep measurements",
        "",
        "Counts of branch points by how the 90% intervals lie (first against second; "
        '"no comparison" where one side has no interval or number):',
        "",
        *_summary(results),
        "",
        DISCUSSION_FILE.read_text().strip()
        if DISCUSSION_FILE.exists()
        else "(Discussion written after the full run.)",
        "",
    ]
    return "\n".join(lines)
