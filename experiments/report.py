"""docs/reproduction.md: tables per task, checks against the issue's targets, figures."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from experiments.analysis import b_simple_per_batch, run_name
from experiments.tasks import TaskSpec
from noisescope import sweep

__all__ = ["TaskResult", "b_crit_text", "frontier_edges", "ratio", "render", "tried_rates"]


@dataclass
class TaskResult:
    spec: TaskSpec
    report: sweep.CriticalBatchReport
    runs: list[sweep.SweepRun]
    records: list[dict[str, Any]]
    figure: str
    resent: int | None = None
    #: The server's runs of the task that the cache does not hold, archived by this invocation.
    archived: int = 0


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return f"{x:.{digits}g}"


def ratio(t: sweep.TargetResult) -> float | None:
    """B_simple / B_crit where B_crit is determined (1: the noise scale predicts it exactly)."""
    if not t.determined or t.b_crit is None or t.b_simple is None:
        return None
    return t.b_simple / t.b_crit


def b_crit_text(t: sweep.TargetResult) -> str:
    """B_crit with its interval ("200 [150–260]"), as the report's table and the run's progress
    lines write it; "not determined" (with the fit's estimate, if any, named as such) otherwise."""
    if t.determined and t.b_crit_lo is not None and t.b_crit_hi is not None:
        return f"{_fmt(t.b_crit)} [{_fmt(t.b_crit_lo)}–{_fmt(t.b_crit_hi)}]"
    if t.b_crit_estimate is not None:
        return f"not determined (fit's estimate: {_fmt(t.b_crit_estimate)})"
    return "not determined"


def _truth_at(records: Sequence[dict[str, Any]], t: sweep.TargetResult, key: str) -> float | None:
    """Median over the frontier runs of a closed-form quantity at the crossing (lsq only)."""
    by_uid = {run_name(r["batch_size"], r["lr"], r.get("seed", 0)): r for r in records}
    values = []
    for run in t.runs:
        if not run.frontier or run.steps is None:
            continue
        ev = by_uid[run.uid]["evals"]
        if key not in ev:
            return None
        s = run.steps
        i = min(range(len(ev["step"])), key=lambda j: abs(ev["step"][j] - s))
        values.append(ev[key][i])
    return statistics.median(values) if values else None


#: Per batch size (task units): each learning rate tried there (6 digits, as the sweep groups
#: seeds) and whether a run at it diverged.
Tried = dict[float, dict[float, bool]]


def tried_rates(records: Sequence[dict[str, Any]]) -> Tried:
    """The learning rates tried per batch size, each marked diverged when any of its runs
    stopped as diverged or its loss curve diverged (``sweep.divergence``)."""
    tried: Tried = {}
    for r in records:
        curve = r["evals"]
        blew = r["status"] == "diverged" or (
            sweep.divergence(curve["step"], curve["loss"]) is not None
        )
        at = tried.setdefault(float(r["batch_size_units"]), {})
        lr = float(f"{r['lr']:.6g}")
        at[lr] = at.get(lr, False) or blew
    return tried


def frontier_edges(tried: Tried, t: sweep.TargetResult) -> dict[str, list[float]]:
    """Where each frontier point's learning rate sits among those tried at its batch size:
    ``interior`` (a slower rate tried on each side), ``stability edge`` (the next larger rate
    tried diverged: the optimum is bounded by it), or an open ``grid top``/``grid bottom`` (no
    larger/smaller rate tried: the optimum may lie beyond the grid). Batch sizes in task units."""
    out: dict[str, list[float]] = {
        "interior": [],
        "stability edge": [],
        "grid top": [],
        "grid bottom": [],
    }
    for p in t.points:
        if p.lr is None:
            continue
        lr, rates = float(f"{p.lr:.6g}"), tried.get(p.batch_size, {})
        larger = sorted(x for x in rates if x > lr)
        if not larger:
            out["grid top"].append(p.batch_size)
        elif not any(x < lr for x in rates):
            out["grid bottom"].append(p.batch_size)
        elif rates[larger[0]]:
            out["stability edge"].append(p.batch_size)
        else:
            out["interior"].append(p.batch_size)
    return out


def _edges_text(edges: dict[str, list[float]]) -> str:
    parts = [
        f"{len(v)} {k}" + (f" (B = {', '.join(_fmt(b) for b in v)})" if k != "interior" else "")
        for k, v in edges.items()
        if v
    ]
    return ", ".join(parts) if parts else "–"


def _determined(res: TaskResult) -> list[sweep.TargetResult]:
    return [t for t in res.report.targets if t.determined and t.b_crit is not None]


def task_section(res: TaskResult) -> tuple[str, list[str]]:
    """The markdown for one task and a list of target misses."""
    spec = res.spec
    u = spec.unit_label
    bs = [b * spec.tokens_per_example for b in spec.batch_sizes]
    n_runs = len(res.records)
    statuses: dict[str, int] = {}
    for r in res.records:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    wall = sum(r["wall_s"] for r in res.records)
    level = f"{res.report.level:.0%}"
    lines = [
        f"### {spec.title} (`{spec.name}`)",
        "",
        f"{spec.description}. Batch sizes ({u}): {', '.join(f'{b:g}' for b in bs)}; "
        f"learning rates ({spec.optimizer}): {', '.join(f'{lr:g}' for lr in spec.lrs)}; "
        f"{spec.micro_batches} micro-batches per step give the two-batch samples"
        + (
            f" (a batch smaller than {spec.micro_batches} splits into one example each); "
            if min(spec.batch_sizes) < spec.micro_batches
            else "; "
        )
        + "seeds per "
        f"(B, lr): {spec.seeds}. "
        f"{n_runs} runs ({', '.join(f'{v} {k}' for k, v in sorted(statuses.items()))}), "
        f"{wall / 60:.1f} min of training (wall clock, shared 2-core machine)."
        + (
            f" Server: {res.resent} of {n_runs} runs were re-sent from the run cache by this "
            "invocation (the others were logged as they trained, or were already there)"
            + (
                f"; {res.archived} runs of an earlier version of the task, not in the run "
                "cache, were archived there, so the server's sweep is this one."
                if res.archived
                else "."
            )
            if res.resent is not None
            else ""
        ),
        "",
    ]
    truth = any("b_simple_true" in r["evals"] for r in res.records)
    head = (
        f"| loss target | B reaching | S_min | E_min | B_crit [{level}] "
        f"| B_simple [{level}] (range over the B where measured) | B_simple / B_crit |"
    )
    sep = "|---|---|---|---|---|---|---|"
    if truth:
        head += " closed-form B_simple | closed-form B_noise |"
        sep += "---|---|"
    lines += [head, sep]
    misses = []
    notes = []
    edge_lines = []
    tried = tried_rates(res.records)
    for t in res.report.targets:
        per_b = [v[0] for v in b_simple_per_batch(res.runs, t).values() if v[0] is not None]
        simple = (
            f"{_fmt(t.b_simple)} [{_fmt(t.b_simple_lo)}–{_fmt(t.b_simple_hi)}]"
            if t.b_simple is not None
            else "–"
        )
        if per_b:
            simple += f" ({_fmt(min(per_b))}–{_fmt(max(per_b))})"
        rt = ratio(t)
        line = (
            f"| {t.target:g} | {len(t.points)} | {_fmt(t.s_min)} | {_fmt(t.e_min)} | "
            f"{b_crit_text(t)} | {simple} | {_fmt(rt, 2)} |"
        )
        if truth:
            line += (
                f" {_fmt(_truth_at(res.records, t, 'b_simple_true'))} |"
                f" {_fmt(_truth_at(res.records, t, 'b_noise_true'))} |"
            )
        lines.append(line)
        edges = frontier_edges(tried, t)
        edge_lines.append(f"| {t.target:g} | {_edges_text(edges)} |")
        open_edges = edges["grid top"] + edges["grid bottom"]
        if open_edges:
            misses.append(
                f"{spec.name} @ {t.target:g}: frontier at an open edge of the lr grid at "
                f"B = {', '.join(_fmt(b) for b in open_edges)}"
            )
        said = list(t.warnings)
        if t.b_simple_reason is not None:
            said.append(f"B_simple: {t.b_simple_reason}")
        if said:
            notes.append(f"- loss {t.target:g}: " + "; ".join(said) + ".")
        if not t.determined:
            misses.append(f"{spec.name} @ {t.target:g}: B_crit not determined")
        elif rt is None:
            misses.append(f"{spec.name} @ {t.target:g}: no B_simple ({t.b_simple_reason})")
        elif not 1 / 3 <= rt <= 3:
            misses.append(f"{spec.name} @ {t.target:g}: B_simple/B_crit = {rt:.2f}")
    lines += [
        "",
        "Where each frontier point's learning rate sits among the rates tried at its batch size "
        "(*stability edge*: the next larger rate diverged, so the optimum is bounded; *grid "
        "top/bottom*: nothing faster was tried beyond it, an open edge):",
        "",
        "| loss target | frontier points |",
        "|---|---|",
        *edge_lines,
    ]
    if notes:
        lines += ["", "Notes from the analysis (`noisescope.sweep`):", "", *notes]
    # A frontier learning rate at an edge of the grid is among the notes above: the product's
    # rule (noisescope.sweep.lr_grid_warnings) says it in the report's own warnings.
    targets = res.report.targets
    b_simples = [t.b_simple for t in targets if t.b_simple is not None]
    rising = len(b_simples) >= 2 and all(b2 > b1 for b1, b2 in itertools.pairwise(b_simples))
    determined = _determined(res)
    crits = [t.b_crit for t in determined if t.b_crit is not None]
    crit_rising = len(crits) >= 2 and all(c2 > c1 for c1, c2 in itertools.pairwise(crits))
    over = (
        ""
        if len(determined) == len(targets)
        else f" (over the {len(determined)} of {len(targets)} targets where it is determined)"
    )
    # Within runs: the frontier runs of each batch size at the lowest target, B_simple at the
    # first and at the last target in those same runs.
    by_uid = {r.uid: r for r in res.runs}
    first = {r.uid: r.steps for r in targets[0].runs}
    last = {r.uid: r.steps for r in targets[-1].runs}
    growth = []
    for p in targets[-1].points:
        group = [by_uid[i] for i in p.run_uids]
        early = sweep.b_simple_at_loss(group, first)[0]
        late = sweep.b_simple_at_loss(group, last)[0]
        if early and late:
            growth.append(late / early)
    per_run_up = sum(1 for g in growth if g > 1)
    lines += [
        "",
        "B_simple (pooled over the frontier) rises monotonically as the loss falls: "
        f"**{'yes' if rising else 'no'}**; fitted B_crit rises monotonically{over}: "
        f"**{'yes' if crit_rising else 'no'}**. "
        f"Within runs: B_simple at loss {targets[-1].target:g} exceeds B_simple at loss "
        f"{targets[0].target:g} for **{per_run_up} of {len(growth)}** batch sizes where it is "
        f"measured at both (of {len(targets[-1].points)} on the frontier; same runs: the "
        "frontier runs of each batch size at the lowest target; median growth "
        f"{_fmt(statistics.median(growth), 2) if growth else '–'}×).",
        "",
        f"![{spec.title}]({res.figure})",
        "",
    ]
    if not rising:
        misses.append(f"{spec.name}: B_simple does not rise monotonically as loss falls")
    return "\n".join(lines), misses


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    for rank, i in enumerate(order):
        ranks[i] = float(rank)
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (no ties expected among a handful of tasks)."""
    n = len(xs)
    if n < 3:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    d2 = sum((a - b) ** 2 for a, b in zip(rx, ry, strict=True))
    return 1.0 - 6.0 * d2 / (n * (n * n - 1))


def ordering_section(results: Sequence[TaskResult]) -> list[str]:
    """The paper's ordering claim as a test: per task, how far its lowest target is below its
    starting loss, and its B_crit and B_simple there and over its targets; rank correlations
    across tasks."""
    rows = []
    for res in results:
        firsts = [r["evals"]["loss"][0] for r in res.records if r["evals"]["loss"]]
        start = statistics.median(firsts) if firsts else None
        determined = _determined(res)
        if start is None or not determined:
            continue
        last = determined[-1]
        crits = [t.b_crit for t in determined if t.b_crit is not None]
        simples = [t.b_simple for t in determined if t.b_simple is not None]
        rows.append(
            {
                "task": res.spec.name,
                "units": res.spec.unit_label,
                "start": start,
                "target": last.target,
                "relative": last.target / start,
                "b_crit": last.b_crit,
                "b_simple": last.b_simple,
                "median_crit": statistics.median(crits),
                "median_simple": statistics.median(simples) if simples else None,
            }
        )
    lines = [
        "| task | units | loss at start | lowest determined target | target / start | "
        "B_crit there | B_simple there | median B_crit | median B_simple |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: r["median_crit"]):
        lines.append(
            f"| {r['task']} | {r['units']} | {_fmt(r['start'])} | {_fmt(r['target'])} | "
            f"{_fmt(r['relative'], 2)} | {_fmt(r['b_crit'])} | {_fmt(r['b_simple'])} | "
            f"{_fmt(r['median_crit'])} | {_fmt(r['median_simple'])} |"
        )
    both = [r for r in rows if r["median_simple"] is not None]
    rho_noise = spearman([r["median_simple"] for r in both], [r["median_crit"] for r in both])
    rho_depth = spearman([-r["relative"] for r in rows], [r["median_crit"] for r in rows])
    lines += [
        "",
        f"Rank correlation across the {len(both)} tasks with both: median B_simple against "
        f"median B_crit, Spearman ρ = **{_fmt(rho_noise, 2)}** (1: B_simple orders the tasks "
        "exactly as their sweeps do). Across the "
        f"{len(rows)} tasks with a determined B_crit: how deep the lowest determined target lies "
        f"(a smaller target / start) against median B_crit, ρ = **{_fmt(rho_depth, 2)}** "
        "(positive: the tasks trained to a lower relative loss need larger batches). Units "
        "differ (tokens for the language model, episodes for CartPole, examples elsewhere), so "
        "the ranks across tasks compare numbers in different units, as the paper's figure does.",
    ]
    return lines


def render(
    results: Sequence[TaskResult],
    summary_figure: str,
    command: str,
    discussion: str,
) -> str:
    sections = []
    misses: list[str] = []
    span_lines = [
        "| task | units | B_crit range over targets (targets determined) |",
        "|---|---|---|",
    ]
    medians = {}
    for res in results:
        text, m = task_section(res)
        sections.append(text)
        misses += m
        crits = [t.b_crit for t in _determined(res) if t.b_crit is not None]
        n_targets = len(res.report.targets)
        if crits:
            medians[res.spec.name] = statistics.median(crits)
            span_lines.append(
                f"| {res.spec.name} | {res.spec.unit_label} | {_fmt(min(crits))} – "
                f"{_fmt(max(crits))} ({len(crits)} of {n_targets}) |"
            )
        else:
            span_lines.append(
                f"| {res.spec.name} | {res.spec.unit_label} | none determined (0 of {n_targets}) |"
            )
    spread = max(medians.values()) / min(medians.values()) if len(medians) >= 2 else None
    ratios = [ratio(t) for res in results for t in res.report.targets]
    within = sum(1 for r in ratios if r is not None and 1 / 3 <= r <= 3)
    compared = sum(1 for r in ratios if r is not None)
    total = len(ratios)
    level = f"{results[0].report.level:.0%}" if results else "90%"
    out = [
        "# Reproduction: does the noise scale predict the critical batch size?",
        "",
        "McCandlish et al. (2018) claim that the simple noise scale B_simple = tr(Σ)/|G|², "
        "measured cheaply during one run, predicts the critical batch size B_crit that a whole "
        "batch-size sweep measures, and that both grow as the loss falls. This page tests that "
        f"with noisescope's own client and server on {len(results)} CPU tasks. Everything "
        "below, numbers "
        "and figures, is written by",
        "",
        f"    {command}",
        "",
        "Smaller runs of the same code: `--quick` (tiny sweeps: seconds to minutes per task, "
        "logged to a project of their own, `noisescope-reproduction-quick`), "
        "`--tasks digits` (some tasks), `--url URL` (log to a running server, such as the "
        "README's `noisescope up`, instead of starting one). A run of fewer than every task, or "
        "`--quick`, writes its report to `<out>/report` (`experiments/runs/full/report/`, or "
        "`experiments/runs/quick/report/`) and leaves this page as it is. The README's sweep "
        "step is this page's digits sweep, logged to the server the dashboard reads:",
        "",
        "    python -m experiments --tasks digits --url http://127.0.0.1:8765",
        "",
        "## Method",
        "",
        "- Per task, a sweep over batch sizes B (≥ 6, spanning ≥ 32×) and a small learning-rate "
        "grid. Batches are drawn i.i.d. with replacement. Every run is logged through "
        "`noisescope.init(...)`/`Run.log_sample(...)` to a `noisescope server` started by the "
        "command (SQLite), live or offline-spooled and delivered by `noisescope.sync`; every "
        "evaluation is logged too (`Run.log(step, eval_loss=...)`). Finished runs are cached on "
        "disk; a cached run the server does not have is re-sent from the cache through the same "
        "client API, samples and evaluations (counted per task below).",
        "- The loss that defines the targets is smooth by construction: exact for least squares, "
        "the full training-set loss for the digits MLP, conv net and VAE (the VAE's negative "
        "ELBO with its sampling noise fixed), a fixed held-out set for the language model, and "
        "for CartPole 500 − the mean return of 32 evaluation episodes played with fixed random "
        "numbers (the negative return, shifted to stay positive), evaluated every 4 % of the "
        "steps so far; the step at which a run reaches a target is interpolated between "
        "evaluations.",
        "- Frontier: per target and batch size, the learning rate that reached the target in the "
        "fewest steps, the median over its seeds (a seed that never reached it counts as "
        "infinitely slow).",
        "- Fit: `noisescope.estimators.fit_critical_batch` fits S = S_min + E_min·(1/B), i.e. "
        "S = S_min(1 + B_crit/B), to the frontier by weighted least squares in 1/B with weights "
        "1/S² (relative errors: a batch size that needs 10× the steps scatters 10× as much, and "
        "every batch size counts alike); B_crit = E_min/S_min, with its "
        f"{level} Fieller interval for that ratio (Student t on n − 2 degrees of freedom, n the "
        "number of batch sizes on the frontier). B_crit is *determined* when at least 3 batch "
        "sizes reach the target, S_min and E_min are positive, the interval is bounded (S_min "
        "significantly above zero) and B_crit lies within the batch sizes that reached the "
        'target; otherwise the table says "not determined" and the notes under it give the '
        "reason.",
        "- B_simple at a target: each step splits its batch into micro-batches (gradient "
        "accumulation); micro-batch gradients are G_small, their mean is G_big. Over the step "
        "window [s*/1.25, 1.25·s*] around each frontier run's crossing step s*, the unbiased "
        "|𝒢|² and 𝒮 (docs/science.md, App. A.1) are summed over all frontier runs of the target "
        "(every batch size and seed) and B_simple is the ratio of the sums, with the "
        f"{level} interval of `noisescope.estimators.interval_from_blocks` (jackknife over "
        "blocks of consecutive steps, Fieller). In parentheses: the range of the same quantity "
        "per frontier batch size. B_simple / B_crit compares the point values where B_crit is "
        "determined.",
        "- The same analysis (`noisescope.sweep.analyse`, called by `experiments/analysis.py`, "
        "which only turns cached run records into its inputs) and the same settings are applied "
        "to every task; the server's `GET /api/v1/tasks/{project}/{task}/critical-batch` runs "
        "the same code on the logged evaluation losses and gives the same B_crit. Loss targets "
        "were fixed before each task's full run (changes made after pilot runs are listed at "
        "the end).",
        "",
        "## Summary",
        "",
        f"- B_simple within 3× of the fitted B_crit: **{within} of {compared}** (task, target) "
        f"pairs where B_crit is determined (of {total}).",
        "- Spread of B_crit across tasks (ratio of the per-task medians over determined "
        f"targets): **{_fmt(spread, 3)}×** (target ≥ 10×; units differ: tokens for the language "
        "model, episodes for CartPole).",
        "",
        *span_lines,
        "",
        f"![B_simple vs B_crit]({summary_figure})",
        "",
        "The same tasks on the dashboard's Compare tasks page, read from the server this command "
        "logged to (`noisescope server --database-url sqlite:///experiments/runs/full/"
        "noisescope.db`, then `python scripts/dashboard_screenshots.py --server URL --only "
        "compare_tasks_paper --prefix reproduction_`; the page's own targets are the ones each "
        "task's runs declare, the same as here), every unit on one chart as the paper draws it:",
        "",
        "![Compare tasks](figures/reproduction_compare_tasks_paper.png)",
        "",
        "### Do harder tasks need larger batches?",
        "",
        *ordering_section(results),
        "",
        "Misses against the issue's targets: "
        + ("none." if not misses else "; ".join(misses) + "."),
        "",
        "## Tasks",
        "",
        *sections,
        "## Where the prediction holds and where it does not",
        "",
        discussion,
        "",
    ]
    return "\n".join(out)
