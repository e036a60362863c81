"""The page's tables and figure for ``experiments.schedule_experiment``: a task's result (the
frontier, each schedule variant and the control, per loss target) as Markdown and as the
steps-vs-examples plot with the fitted hyperbola."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from experiments.tasks import TaskSpec
from noisescope import _format


def _fmt(s: dict[str, float]) -> str:
    """A count's median [min–max] as the dashboard writes counts ("15,872", never "1.587e+04")."""
    return f"{_format.count(s['median'])} [{_format.count(s['min'])}–{_format.count(s['max'])}]"


def markdown(result: dict[str, Any], spec: TaskSpec) -> str:
    rows = [r for r in result["rows"] if not r.get("missing")]
    control = any("control" in r for r in rows)
    lines = [
        f"Task `{spec.name}` ({spec.title}), {result['repeats']} repeats (seeds 0–"
        f"{result['repeats'] - 1}); median [min–max] over repeats; learning rate tuned per "
        "fixed batch and per schedule variant on the same grid (fewest median steps). "
        '"As good": a fixed batch whose median steps and examples are both at most the '
        "schedule's; \"within range\": a fixed batch whose seeds' min–max ranges overlap the "
        "schedule's on steps and on examples alike.",
        "",
    ]
    for r in result["rows"]:
        if r.get("missing"):
            lines.append(f"Loss {r['target']:g}: fewer than 3 fixed batch sizes reached it.")
    for variant, settings in result["variants"].items():
        head = (
            "| loss target | schedule steps | schedule examples | best small B: steps "
            "| best large B: examples | S/S_min, E/E_min | (S/S_min−1)(E/E_min−1) "
            "| fixed B as good | fixed B within range |"
        )
        rule = "|---|---|---|---|---|---|---|---|---|"
        if control:
            head += " fixed B, noise lr rule: product; as good |"
            rule += "---|"
        lines += [f"Schedule variant `{variant}` ({settings or 'library defaults'}):", ""]
        lines += [head, rule]
        wins = apart = control_wins = counted = 0
        for row in rows:
            sc = row["schedules"].get(variant)
            if sc is None:
                lines.append(f"| {row['target']:g} | not reached by all repeats |" + " |" * 7)
                continue
            counted += 1
            small = row["fixed"][str(row["small"])]
            large = row["fixed"][str(row["large"])]
            inside = sc.get("frontier_product", math.inf) < 1.0
            wins += inside and not sc["dominated_by"]
            apart += inside and not sc["dominated_by"] and not sc["overlaps"]
            ctl = sc.get("control")
            control_wins += bool(
                ctl and ctl.get("frontier_product", math.inf) < 1.0 and not ctl["dominated_by"]
            )
            line = (
                f"| {row['target']:g} | {_fmt(sc['steps'])} | {_fmt(sc['examples'])} "
                f"| {_fmt(small['steps'])} (B={row['small']}) "
                f"| {_fmt(large['examples'])} (B={row['large']}) | {_place(sc)} "
                f"| {_bs(sc['dominated_by'])} | {_bs(sc['overlaps'])} |"
            )
            if control:
                line += f" {_product(ctl)}; {_bs(ctl['dominated_by'])} |" if ctl else " n/a |"
            lines.append(line)
        lines += [
            "",
            f"`{variant}`: undominated and inside the fitted hyperbola at {wins} of "
            f"{len(rows)} targets, and also with its seeds' range apart from every fixed "
            f"batch's on steps or on examples at {apart} of {len(rows)}"
            + (
                "; against fixed batches under the noise learning-rate rule, undominated "
                f"and inside their hyperbola at {control_wins} of {len(rows)}"
                if control
                else ""
            )
            + (f" (reached by all repeats at {counted})." if counted < len(rows) else "."),
            "",
        ]
    lines.append(
        "Fixed-batch frontier per target (best lr per B; fit S = S_min(1 + B_crit/B)): "
        + "; ".join(_frontier_fit(r) for r in rows)
    )
    if control:
        lines += [
            "",
            "The same, fixed batches under the noise learning-rate rule: "
            + "; ".join(
                _frontier_fit({"target": r["target"], **r["control"]})
                for r in rows
                if "control" in r
            ),
        ]
    return "\n".join(lines) + "\n"


def _bs(batches: list[int]) -> str:
    return ", ".join(f"B={b}" for b in batches) or "none"


def _product(entry: dict[str, Any]) -> str:
    return f"{entry['frontier_product']:.2f}" if "frontier_product" in entry else "n/a"


def _place(entry: dict[str, Any]) -> str:
    if "steps_over_min" not in entry:
        return "n/a | n/a"
    return f"{entry['steps_over_min']:.2f}, {entry['examples_over_min']:.2f} | {_product(entry)}"


def _frontier_fit(row: dict[str, Any]) -> str:
    """S_min, E_min and B_crit with its Fieller interval, or why there is no B_crit."""
    head = f"L={row['target']:g}: "
    if not math.isfinite(row["b_crit"]):
        return head + f"no B_crit ({row.get('b_crit_reason')})"
    lo, hi = row.get("b_crit_lo"), row.get("b_crit_hi")
    level = row.get("b_crit_level", 0.9)
    interval = (
        f" [{_format.count(lo)}–{_format.count(hi)}, {level:.0%}]"
        if lo is not None and hi is not None
        else f" (interval unbounded at {level:.0%})"
    )
    return (
        head + f"S_min={_format.count(row['s_min'])}, E_min={_format.count(row['e_min'])}, "
        f"B_crit={_format.count(row['b_crit'])}{interval}"
    )


def _point(target: float, who: str, label: str, stats: dict[str, Any]) -> dict[str, Any]:
    return {
        "target": f"loss {target:g}",
        "who": who,
        "label": label,
        "steps": stats["steps"]["median"],
        "steps_lo": stats["steps"]["min"],
        "steps_hi": stats["steps"]["max"],
        "examples": stats["examples"]["median"],
        "examples_lo": stats["examples"]["min"],
        "examples_hi": stats["examples"]["max"],
    }


CONTROL = "fixed batch, noise lr rule"
HYPERBOLA = "fitted hyperbola"


def save_figure(result: dict[str, Any], path: Path) -> None:
    import altair as alt
    import pandas as pd

    targets = result["targets"]
    points: list[dict[str, Any]] = []
    curve: list[dict[str, Any]] = []
    for row in result["rows"]:
        if row.get("missing"):
            continue
        for b, f in row["fixed"].items():
            points.append(_point(row["target"], "fixed batch", f"B={b}", f))
        for b, f in row.get("control", {}).get("fixed", {}).items():
            points.append(_point(row["target"], CONTROL, f"B={b}", f))
        for variant, sc in row["schedules"].items():
            points.append(_point(row["target"], f"schedule ({variant})", variant, sc))
        if math.isfinite(row["b_crit"]):  # the fitted hyperbola, B from B_crit/16 to 16·B_crit
            curve += [
                {
                    "target": f"loss {row['target']:g}",
                    "k": k,
                    "steps": row["s_min"] * (1.0 + 2.0 ** (-k / 4)),
                    "examples": row["e_min"] * (1.0 + 2.0 ** (k / 4)),
                }
                for k in range(-16, 17)
            ]
    whos = ["fixed batch"] + [f"schedule ({v})" for v in result["variants"]]
    if any(p["who"] == CONTROL for p in points):
        whos.insert(1, CONTROL)
    palette = ["#7f7f7f", "#bcbd22", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"]
    color = alt.Color(
        "who:N",
        title=None,
        scale=alt.Scale(domain=whos, range=palette[: len(whos)]),
        legend=alt.Legend(orient="bottom", columns=3),
    )
    curve_rows = [{**c, "who": HYPERBOLA} for c in curve]
    base = alt.Chart(pd.DataFrame(points + curve_rows))
    marks = base.transform_filter(alt.datum.who != HYPERBOLA)
    x_log = alt.X("examples:Q", scale=alt.Scale(type="log"), title="examples to target")
    y_log = alt.Y("steps:Q", scale=alt.Scale(type="log"), title="optimizer steps to target")
    dots = marks.mark_point(filled=True, size=50).encode(
        x=x_log,
        y=y_log,
        color=color,
        tooltip=["who:N", "label:N", "steps:Q", "examples:Q"],
    )
    hyperbola = (
        base.transform_filter(alt.datum.who == HYPERBOLA)
        .mark_line(color="#7f7f7f", strokeDash=[4, 3], clip=True)
        .encode(x="examples:Q", y="steps:Q", order="k:Q")
    )
    ybars = marks.mark_rule().encode(x="examples:Q", y="steps_lo:Q", y2="steps_hi:Q", color=color)
    xbars = marks.mark_rule().encode(
        x="examples_lo:Q", x2="examples_hi:Q", y="steps:Q", color=color
    )
    text = (
        base.transform_filter(alt.datum.who == "fixed batch")
        .mark_text(dx=16, dy=-6, fontSize=9)
        .encode(x="examples:Q", y="steps:Q", text="label:N", color=color)
    )
    frontier = (
        alt.layer(hyperbola, ybars, xbars, dots, text)
        .properties(width=210, height=190)
        .facet(
            facet=alt.Facet("target:N", title=None, sort=[f"loss {t:g}" for t in targets]),
            columns=2,
        )
        .resolve_scale(x="independent", y="independent")
    )
    traj: list[dict[str, Any]] = []
    shown = dict(list(result["trajectories"].items())[:1])  # the first variant: the default
    for variant, rows in shown.items():
        traj += [
            {"step": s, "series": f"batch size, schedule ({variant})", "value": b}
            for s, b, _, _ in rows
        ]
        traj += [
            {"step": s, "series": f"B_simple now, scheduler ({variant})", "value": n}
            for s, _, n, _ in rows
            if n
        ]
    first: list[Any] = next(iter(result["trajectories"].values()), [])
    traj += [
        {"step": s, "series": "B_simple, closed form", "value": t} for s, _, _, t in first if t
    ]
    lines = (
        alt.Chart(pd.DataFrame(traj))
        .mark_line()
        .encode(
            x=alt.X("step:Q", title="optimizer step"),
            y=alt.Y("value:Q", scale=alt.Scale(type="log"), title="examples"),
            color=alt.Color("series:N", title=None, legend=alt.Legend(orient="bottom")),
        )
        .properties(width=440, height=200, title="Batch size chosen by the schedule (seed 0)")
    )
    chart = (
        alt.vconcat(frontier, lines)
        .resolve_scale(color="independent")
        .properties(
            title=f"{result['task']}: noise-scale schedule vs fixed batch sizes "
            f"({result['repeats']} repeats; bars: min–max)"
        )
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    chart.save(str(path), ppi=80)
