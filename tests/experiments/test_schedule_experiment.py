"""experiments.schedule_experiment: the frontier comparison on known points, and the command
writing its section, table and figure."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments import schedule_experiment as se


def _trace(steps: int, examples: float, target: float = 1.0) -> se.Trace:
    return se.Trace(reached={target: (steps, examples)}, steps=steps, examples=examples)


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": sorted(values)[len(values) // 2], "min": min(values), "max": max(values)}


def test_fixed_batches_on_a_hyperbola_give_it_back_and_judge_a_schedule_against_it() -> None:
    s_min, b_crit = 100.0, 32.0
    fixed = {
        b: {0.1: [_trace(round(s_min * (1 + b_crit / b)), b * s_min * (1 + b_crit / b))] * 3}
        for b in (4, 8, 16, 32, 64, 128)
    }
    frontier = se._frontier(fixed, 1.0)
    assert frontier is not None
    assert frontier["b_crit"] == pytest.approx(b_crit, rel=0.02)
    assert frontier["s_min"] == pytest.approx(s_min, rel=0.02)
    # inside: 1.5x S_min and 1.5x E_min (product 0.25); the seeds' spread decides "apart"
    e_min = s_min * b_crit
    inside = {"steps": _stats([140.0, 150.0, 160.0]), "examples": _stats([4600.0, 4800.0, 5000.0])}
    judged = se._against(inside, frontier)
    assert judged["frontier_product"] == pytest.approx(0.25, rel=0.05)
    assert judged["dominated_by"] == [] and judged["overlaps"] == []
    # at the fixed B = 32 point exactly: dominated by it (a tie counts) and within its range
    at_32 = {"steps": _stats([200.0] * 3), "examples": _stats([2 * e_min] * 3)}
    judged = se._against(at_32, frontier)
    assert judged["dominated_by"] == [32] and 32 in judged["overlaps"]
    assert judged["frontier_product"] == pytest.approx(1.0, rel=0.05)


def test_fewer_than_three_batch_sizes_reaching_a_target_give_no_frontier() -> None:
    fixed = {4: {0.1: [_trace(100, 400.0)]}, 8: {0.1: [se.Trace()]}, 16: {0.1: [se.Trace()]}}
    assert se._frontier(fixed, 1.0) is None


def test_the_command_writes_its_section_table_and_figure(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Page\n\nprose kept\n")
    figure = tmp_path / "figure.png"
    argv = ["--task", "lsq", "--quick", "--repeats", "2", "--out", str(tmp_path / "runs")]
    argv += ["--figure", str(figure), "--page", str(page), "--jobs", "2"]
    assert se.main(argv) == 0
    text = page.read_text()
    assert text.startswith("# Page\n\nprose kept\n")
    assert "<!-- section:schedule-lsq -->" in text
    assert "python -m experiments.schedule_experiment --task lsq --quick" in text
    for variant in ("default", "noise", "noise-sqrt", "noise-lr-only"):
        assert f"Schedule variant `{variant}`" in text
    assert "](figure.png)" in text and figure.stat().st_size > 0
    # a rerun reads every run from the cache and writes the same section
    assert se.main(argv) == 0
    assert page.read_text() == text
