"""Run page: one run's B_simple now (with its interval and window), the verdict on its batch,
and its curves: B_simple with its band and the batch in use, |G|², tr(Σ), loss (evaluations
as points), learning rate, per-layer B_simple, batch-size changes as marks; for a run with
branch runs (``noisescope.branch``), B_simple beside the branch-measured local critical batch
sizes and the sweep's B_crit at the same loss (``GET /runs/{id}/branches`` and the forecast).

The headline is ``GET /runs/{id}`` (the same value as the Runs table and the API); the verdict
is ``noisescope.recommend.recommend`` on that same answer (what the server's
``GET /runs/{id}/recommendation`` computes), so one read of a live run gives both and they
cannot disagree; the curves are ``GET /runs/{id}/series``, whose trailing window is the only
thing the smoothing control changes. State lives in the query string.

"Manage this run" renames and re-tags the run, archives or restores it and deletes it (behind a
confirmation), through ``noisescope.Api`` with the dashboard's token: the same requests as the
CLI's ``noisescope runs``; a server with auth on answers them only for a token of the run's
project with the ``manage`` scope. With a token that cannot manage (docs/deployment.md gives
the dashboard a read token) the fold says what it needs instead of offering the changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd
import streamlit as st

from noisescope import (
    Api,
    ApiError,
    EventRow,
    NotFoundError,
    RunSummary,
    SeriesInfo,
    protocol,
)
from noisescope.recommend import recommend
from noisescope_dashboard import _branches, _charts, _data, _frames, _state, _text, _ui
from noisescope_dashboard._text import md

#: Layers drawn by default on the per-layer chart.
DEFAULT_LAYERS = 8


#: The shortest default window: the server gives a window its interval only from 32 samples
#: on (``estimators.MIN_INTERVAL_SAMPLES``), and the B_simple chart is about its interval.
MIN_DEFAULT_WINDOW = 50


def default_window(last_step: int | None) -> int:
    """About 5% of the run's steps, to one significant digit (20,000 -> 1,000), and at least
    ``MIN_DEFAULT_WINDOW`` (but at most half the run); 0 (none) for runs under 10 steps."""
    if not last_step or last_step < 10:
        return 0
    raw = min(max(0.05 * last_step, MIN_DEFAULT_WINDOW), last_step / 2)
    unit = int(10 ** max(math.floor(math.log10(raw)), 0))
    return max(1, round(raw / unit) * unit)


def _x_title(x: str, units: str) -> str:
    return {
        "step": "optimizer step",
        "examples": f"{_text.units_word(units)} seen",
        "time": "seconds since the first sample",
    }[x]


def _pick_run(src: _data.Source) -> RunSummary:
    """The run named by ``?run=`` (an unknown id stops the page with "not found"), else the
    newest; the choice is always written back to the URL."""
    wanted = st.query_params.get("run")
    chosen: RunSummary | None = None
    if wanted:
        # a unique start of an id names the run, as in the CLI (the 8 characters pages show)
        found = protocol.run_ids_matching(wanted, [r.uid for r in _data.run_list(src)])
        if len(found) == 1 and found[0] != wanted:
            wanted = st.query_params["run"] = found[0]  # the full id, in the URL too
        try:
            chosen = _data.run(src, wanted)
        except NotFoundError:
            _ui.not_found(f"Run {md(wanted)}", "no run with this id on this server")
        except ApiError as exc:
            if exc.status != 403:
                raise
            _ui.not_found(f"Run {md(wanted)}", "this token may not read it")
    runs = _data.run_list(src)
    labels = {r.uid: _text.run_label(r) for r in runs}
    if chosen is not None and chosen.uid not in labels:
        labels = {chosen.uid: _text.run_label(chosen), **labels}
    uid = _state.select(
        "Run", list(labels), key="run", format_func=lambda u: labels.get(u, u), keep=True
    )
    assert uid is not None  # connect() checked there is a project, run_page a run
    if chosen is None or chosen.uid != uid:
        chosen = _data.run(src, uid)
    return chosen


def _headline(src: _data.Source, run: RunSummary) -> None:
    """B_simple now (or its lower bound), batch in use, B / B_simple, loss; the steps the number
    comes from; then the verdict, or why there is none."""
    units = _text.units_word(run.units)
    measured = run.b_simple is not None
    bounded = not measured and run.b_simple_lower is not None
    m1, m2, m3, m4 = st.columns(4)
    m1.metric(
        "B_simple now",
        _text.b_simple_now(run) or _text.DASH,
        help=_text.CURRENT_RULE,
    )
    if run.window_samples:
        steps = (
            f", steps {_text.count(run.window_first_step)}–{_text.count(run.window_last_step)}"
            if run.window_first_step is not None and run.window_last_step is not None
            else ""
        )
        value = (
            f"{run.level:.0%} interval {_text.interval(run.b_simple_lo, run.b_simple_hi)} {units}"
            if measured
            else f"{run.level:.0%} lower bound"
            if bounded
            else "No number"
        )
        trend = " by the trend of |G|² and tr(Σ) in the training loss" if run.b_simple_trend else ""
        m1.caption(
            f"{value}. From the last {run.window_samples:,} samples{steps}{trend}: the same "
            "value as the Runs table and the API."
            + (f" {md(_text.sentence(run.window_limit))}" if run.window_limit else "")
        )
    m2.metric(
        "Batch in use",
        f"{_text.count(run.batch_in_use)} {units}" if run.batch_in_use is not None else "—",
        help="The latest batch-size change"
        if run.batch_in_use_source == "event"
        else "The batch size given at init",
    )
    m3.metric(
        "B / B_simple",
        _text.ratio(run.batch_to_b_simple) if measured else "—",
        help="Below 1: a bigger batch would cut steps; above 1: a smaller one would save compute",
    )
    if run.diverged:  # the API's judgement first: the latest loss alone reads as a fine one
        m4.metric("Loss", "diverged", help=_text.sentence(run.diverged_reason or "diverged"))
        m4.caption(
            md(_text.sentence(run.diverged_reason or "its loss diverged"))
            + f" Latest training loss {_text.loss(run.last_loss)}."
        )
    else:
        m4.metric("Loss", _text.loss(run.last_loss), help="The latest training loss")
    if run.last_eval_loss is not None:
        m4.caption(f"Latest evaluation loss {_text.loss(run.last_eval_loss)}")
    if not (measured or bounded):
        st.warning(
            "No B_simple now, so no ratio and no verdict. "
            + md(_text.sentence(_text.no_b_simple_because(run)))
        )
        return
    if run.batch_in_use is None:
        st.caption(
            "No verdict: this run has no batch size on record (pass batch_size= to "
            "noisescope.init, or log a batch_size event)"
        )
        return
    # the verdict from the same read as the numbers above (a live run's next read differs)
    rec = recommend(run, run.batch_in_use, units=run.units)
    (st.info if measured else st.warning)(md(rec.verdict))


def _no_samples(run: RunSummary) -> None:
    """Say that there are no samples ("yet" only while the run runs), the training loop's
    notice if it sent one (the API's reason adds nothing else here), and what to do."""
    head = (
        "This run has no samples yet."
        if run.status == "running"
        else f"This run {md(_text.status(run))} with no samples."  # finished, failed, crashed
    )
    said = f" Its training loop said: {md(_text.sentence(run.notice))}" if run.notice else ""
    st.warning(head + said)
    st.markdown(
        ("What to do: samples" if run.status == "running" else "Next time: samples")
        + " appear a few seconds after the training loop calls the probe. "
        "The probe needs two batch sizes per step — gradient accumulation (several "
        "micro-batches per step), DDP on several processes, or per-example norms; with "
        "Lightning set `accumulate_grad_batches` > 1, with Hugging Face "
        "`gradient_accumulation_steps` > 1. If none arrive, check the training script's log "
        "for the server URL it posts to (see docs/sources.md and docs/integrations.md)."
    )


def _drawn_events(src: _data.Source, run: RunSummary) -> tuple[list[EventRow], list[EventRow]]:
    """The marks and evaluations the charts draw: all of them up to ``_frames.MAX_MARKS`` and
    ``_frames.MAX_EVALS``, else that many spread over the run (the server's every k-th), with
    a caption saying how many of how many. A run with 100,000 events is then read in a few
    thousand rows, not all of them on every chart."""
    counts = _data.event_counts(src, run.uid)
    n_marks = sum(n for kind, n in counts.items() if kind not in _frames.NOT_MARKS)
    n_evals = counts.get(protocol.EVAL_EVENT_KIND, 0)
    marks = (
        _data.events(src, run.uid, exclude_kinds=_frames.NOT_MARKS, max_events=_frames.MAX_MARKS)
        if n_marks
        else []
    )
    evals = (
        _data.events(src, run.uid, kinds=(protocol.EVAL_EVENT_KIND,), max_events=_frames.MAX_EVALS)
        if n_evals
        else []
    )
    thinned = [
        f"{len(drawn):,} of its {_text.plural(total, noun)} (one in {-(-total // most):,})"
        for drawn, total, most, noun in (
            (marks, n_marks, _frames.MAX_MARKS, "mark"),
            (evals, n_evals, _frames.MAX_EVALS, "evaluation"),
        )
        if len(drawn) < total
    ]
    if thinned:
        st.caption(
            "The charts draw " + " and ".join(thinned) + ", spread over the run: "
            "all of them would hide the curves."
        )
    return marks, evals


def _layers_only(src: _data.Source, run: RunSummary, layers: list[SeriesInfo]) -> None:
    """A run that logged per-layer series and no whole-model one: say so (B_simple now, the
    verdict and the run's curves are the whole model's, and the layers need not add up to
    it), then draw the layers' own B_simple."""
    samples = sum(info.n_samples for info in layers)
    st.warning(
        f"No B_simple now: this run logged {len(layers):,} per-layer series "
        f"({_text.plural(samples, 'sample')}) and no whole-model series, which B_simple now, "
        "the verdict and the run's curves read. Each layer's own B_simple is below: pick the "
        'layers to draw. To measure the whole model, log it too (`series=""`, what '
        "`GradientNoiseProbe` logs besides its layers)."
    )
    window = default_window(run.last_step)
    x_axis = _charts.XAxis("x", _x_title("step", run.units), log=False)
    _layers(src, run, x="step", x_axis=x_axis, window=float(window), log_y=True)


def _charts_section(src: _data.Source, run: RunSummary) -> None:
    c1, c2, c3 = st.columns([1.4, 1.2, 1])
    axes = {"step": "step", "examples": _text.units_word(run.units), "time": "wall time"}
    x = _state.radio("x axis", axes, key="x", container=c1)
    window = _state.number(
        "Smoothing window (steps; 0: none)",
        key="window",
        value=default_window(run.last_step),
        min_value=0,
        step=max(1, default_window(run.last_step) // 2),
        help="A trailing window of this many steps: sums of the per-sample estimates, ratio "
        "last. It changes the curves only, never B_simple now. The critical batch size reads "
        "the training loss through a centred window instead "
        '(docs/science.md, "Two smoothers").',
        container=c2,
    )
    with c3:
        log_y = _state.checkbox("log y (B_simple)", key="logy", value=True)
        log_x = _state.checkbox("log x", key="logx")

    series = _data.series(src, run.uid, x=x, window=float(window))  # type: ignore[arg-type]
    points = _frames.series_points(series)
    t0 = _frames.time_origin(series)
    marked, evaluated = _drawn_events(src, run)
    marks = _frames.event_marks(marked, points, x, t0)
    evals = _frames.eval_points(evaluated, points, x, t0)
    x_axis = _charts.XAxis("x", _x_title(x, run.units), log=log_x)
    slug = run.uid[:8]
    smoothing = (
        f"Each point: a trailing window of {int(window):,} steps, drawn at its middle"
        if window
        else "Each point: one bucket of the server's (at most 2,000 per series)"
    )
    _ui.chart_with_downloads(
        _charts.b_simple_chart(
            points,
            x=x_axis,
            log_y=log_y,
            events=marks,
            y_title=f"B_simple ({_text.units_word(run.units)})",
        ),
        points.rename(columns={"x": x}),
        name=f"b_simple_{slug}",
        caption=f"{smoothing}, sums of the per-sample estimates with the ratio taken last; the "
        "band is that window's 90% interval. The smoothing changes only these curves, never "
        "B_simple now above."
        + (
            ""
            if points["b_simple_lo"].notna().any()
            else " No band: windows this short hold too few samples for an interval; widen the "
            "smoothing window to see it."
        ),
    )
    per = _text.units_word(run.units, singular=True)

    def panel(
        y: str, title: str, y_title: str, *, log: bool = False, with_evals: bool = False
    ) -> None:
        _ui.chart_with_downloads(
            _charts.metric_chart(
                points,
                x=x_axis,
                y=y,
                y_title=y_title,
                title=title,
                log_y=log,
                events=marks,
                evals=evals if with_evals else None,
            ),
            points[["step", "x", y]].rename(columns={"x": f"{x} (chart)"}),
            name=f"{y}_{slug}",
        )

    left, right = st.columns(2)
    with left:
        panel("g_sq", "|G|²: the true gradient's squared norm", "|G|²", log=log_y)
    with right:
        panel("trace_sigma", f"tr(Σ) per {per}: the gradient noise", f"tr(Σ) per {per}", log=log_y)
    left, right = st.columns(2)
    with left:
        if points["loss"].notna().any() or not evals.empty:
            title = "Loss (evaluations as points)" if not evals.empty else "Training loss"
            panel("loss", title, "loss", with_evals=True)
        else:
            st.caption("No loss logged: pass `loss=` to `probe.step` or `run.log` to see it here.")
    with right:
        if points["lr"].notna().any():
            panel("lr", "Learning rate", "learning rate")
        else:
            st.caption("No learning rate logged: pass `lr=` to see it here.")
    _layers(src, run, x=x, x_axis=x_axis, window=float(window), log_y=log_y)
    st.download_button(
        "Raw samples (CSV)",
        data=lambda: _data.samples_csv(src, run.uid),
        file_name=f"{run.uid}.csv",
        mime="text/csv",
        on_click="ignore",
        icon=":material/download:",
    )


def _layers(
    src: _data.Source,
    run: RunSummary,
    *,
    x: str,
    x_axis: _charts.XAxis,
    window: float,
    log_y: bool,
) -> None:
    layers = [s.name for s in _data.series_names(src, run.uid) if s.name]
    if not layers:
        return
    chosen = st.multiselect(
        "Layers", layers, default=layers[:DEFAULT_LAYERS], key="layers", bind=_state.BOUND
    )
    if not chosen:
        st.caption("Pick layers to compare their noise scales.")
        return
    frames = [
        _frames.series_points(_data.series(src, run.uid, x=x, name=name, window=window)).assign(  # type: ignore[arg-type]
            layer=name
        )
        for name in chosen
    ]
    per_layer = pd.concat(frames, ignore_index=True)
    _ui.chart_with_downloads(
        _charts.layers_chart(
            per_layer,
            x=x_axis,
            log_y=log_y,
            y_title=f"B_simple ({_text.units_word(run.units)})",
        ),
        per_layer[["layer", "step", "x", "b_simple", "b_simple_lo", "b_simple_hi"]],
        name=f"b_simple_layers_{run.uid[:8]}",
        caption="Each layer's own B_simple, "
        + (
            "smoothed like the chart above."
            if run.n_samples
            else f"over trailing windows of {int(window):,} steps."
            if window
            else "one point per bucket of the server's."
        ),
    )


def _branches_section(src: _data.Source, run: RunSummary) -> None:
    """The proxy, the local and the global critical batch size on one chart (docs/branching.md):
    shown when the run has branch runs."""
    answer = _data.branches(src, run.uid)
    if not answer.points:
        return
    losses = tuple(p.parent_loss for p in answer.points if p.parent_loss is not None)
    forecast = None
    note = "The task has no sweep fit to compare with."
    try:
        found = _data.critical_batch_forecast(src, run.project, run.task, losses)
    except ApiError:
        found = None
    if found is not None and found.units != run.units:
        note = f"The task's sweep counts {found.units}, this run {run.units}: not drawn."
    elif found is not None and found.predictions:
        forecast = found
        note = (
            "Sweep B_crit at the parent's loss: the law B*·L^(−1/α_B) fitted across the task's "
            f"sweep targets (losses {_text.loss(found.loss_min)} to {_text.loss(found.loss_max)}"
            "), extrapolated outside them."
        )
    elif found is not None and found.reason:
        note = f"No sweep B_crit: {md(found.reason)}."
    window = default_window(run.last_step)  # the page's default smoothing, on steps
    series = _data.series(src, run.uid, x="step", window=float(window))
    measured = _branches.marks(answer, forecast)
    _ui.chart_with_downloads(
        _branches.chart(_branches.curve(series), measured, units=run.units),
        measured,
        name=f"branches_{run.uid[:8]}",
        caption=f"B_simple: trailing windows of {window:,} steps with their 90% band. "
        "The local critical batch size at each branch step is the largest batch whose "
        "loss after the branch budget stays within ε of the smallest batch's. "
        + note
        + (
            f" It plateaus from step {answer.plateau_step}."
            if answer.plateau_step is not None
            else f" Plateau: {md(answer.plateau_reason or '')}"
        ),
    )
    _ui.table(_branches.table(answer, forecast))


def _parent_line(src: _data.Source, run: RunSummary) -> None:
    """Which run this one branched from, and if that run is not on the server (a branch run
    may arrive before its parent), that its branch points show on its page once it is."""
    assert run.parent_uid is not None
    line = (
        f"This run is a branch of run [{md(run.parent_uid[:12])}]"
        f"({protocol.run_page_url('', run.parent_uid)}) from its step {run.branch_step}."
    )
    try:
        _data.run(src, run.parent_uid)
    except ApiError as exc:
        if exc.status not in (403, 404):
            raise
        line += (
            " That run is not on this server (or not readable with this token), so the "
            "branch points are shown nowhere yet: they appear on its page once it is there."
        )
    st.caption(line)


#: The session key of what the last change on this page did, said once after its rerun.
_SAID = "_run_admin_said"


def _tags(text: str) -> list[str]:
    """Comma-separated tags as a list: each stripped, empty ones dropped, order kept."""
    return [t for t in (part.strip() for part in text.split(",")) if t]


def _change(src: _data.Source, call: Callable[[Api], None], said: str, *, gone: bool) -> None:
    """Make one change through the API; on success forget every cached answer (lists,
    tasks and comparisons change with it) and rerun, saying ``said``; else say why not.
    ``gone``: the run no longer exists, so the page falls back to the newest run."""
    try:
        call(_data.api(src))
    except ApiError as exc:
        st.error(f"Not changed: {md(exc.detail)}")
        return
    st.cache_data.clear()
    st.session_state[_SAID] = said
    if gone:
        if "run" in st.query_params:
            del st.query_params["run"]
        st.session_state.pop("_qp_run", None)
    st.rerun()


#: The Manage fold with a token that lacks the ``manage`` scope: what it needs, and how.
_CANNOT_MANAGE = (
    "This dashboard's token can read runs but not change them: renaming, tagging, archiving, "
    "restoring and deleting need a token with the `manage` scope. Whoever runs the server "
    "makes one with `noisescope token create --project {project} --scope read,manage`; start "
    "the dashboard with it (`NOISESCOPE_TOKEN`), or use `noisescope runs` with it. A "
    "dashboard open to everyone should keep a read token."
)


def _manage(src: _data.Source, run: RunSummary) -> None:
    """Rename, re-tag, archive or restore, and delete the run (behind a confirmation)."""
    uid = run.uid
    with st.expander("Manage this run: name, tags, archive, delete"):
        if not _data.can_manage(src):
            st.info(_CANNOT_MANAGE.format(project=md(run.project)))
            return
        with st.form(f"edit_{uid}"):
            name = st.text_input(
                "Name", value=run.name, max_chars=protocol.MAX_NAME_LENGTH, key=f"name_{uid}"
            )
            tags = st.text_input(
                "Tags (comma-separated)", value=", ".join(run.tags), key=f"tags_{uid}"
            )
            saved = st.form_submit_button("Save name and tags")
        if saved:
            new_tags = _tags(tags)

            def edit(api: Api) -> None:
                if name != run.name:
                    api.rename_run(uid, name)
                if new_tags != list(run.tags):
                    api.set_tags(uid, new_tags)

            _change(src, edit, "Saved the name and tags.", gone=False)
        left, right = st.columns(2)
        if run.archived_at is None:
            left.caption(
                "Archive: the run leaves the Runs list, sweeps and comparisons; its data is "
                "kept and it can be restored."
            )
            if left.button("Archive", key=f"archive_{uid}", icon=":material/archive:"):
                _change(src, lambda api: api.archive_run(uid), "Archived the run.", gone=False)
        else:
            left.caption("Restore: the run comes back into lists, sweeps and comparisons.")
            if left.button("Restore", key=f"restore_{uid}", icon=":material/unarchive:"):
                _change(src, lambda api: api.restore_run(uid), "Restored the run.", gone=False)
        sure = right.checkbox(
            "Delete this run with its samples and events, for good", key=f"sure_{uid}"
        )
        if right.button("Delete", key=f"delete_{uid}", disabled=not sure, icon=":material/delete:"):
            said = f"Deleted run {md(uid)} with its samples and events."
            _change(src, lambda api: api.delete_run(uid), said, gone=True)


def main(src: _data.Source) -> None:
    st.title("Run")
    said = st.session_state.pop(_SAID, None)
    if said:
        st.success(said)
    picked = _pick_run(src)
    if picked.archived_at is not None:
        st.info(
            f"Archived on {picked.archived_at:%Y-%m-%d %H:%M} UTC: left out of the Runs list, "
            "sweeps and comparisons. Its data is kept (a live job still adds samples); "
            'restore it under "Manage this run".'
        )

    @st.fragment(run_every=_data.LIVE_EVERY if picked.status == "running" else None)
    def body() -> None:
        run = _data.run(src, picked.uid)
        st.subheader(md(run.name), anchor=False)
        tags = ", ".join(run.tags)
        st.caption(
            md(f"{run.project} / {run.task} · status {_text.status(run)} · units {run.units}")
            + (" · tags: " + md(tags) if tags else "")
            + f" · run id {md(run.uid)}"
        )
        if run.parent_uid is not None:
            _parent_line(src, run)
        with st.expander("Config"):
            st.json(run.config)
        if run.n_samples == 0:
            layers = [info for info in _data.series_names(src, run.uid) if info.name]
            if layers:
                _layers_only(src, run, layers)
            else:
                _no_samples(run)
            return
        _headline(src, run)
        _charts_section(src, run)
        _branches_section(src, run)

    body()
    _manage(src, picked)


_ui.run_page(main)
