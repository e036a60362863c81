"""experiments.sections: a command rewrites only its own section of a generated page."""

from __future__ import annotations

from experiments import sections


def test_a_section_is_added_replaced_and_carried_over() -> None:
    page = "# Title\n\nbody\n"
    once = sections.replace(page, "branching", "first")
    assert once.startswith(page.rstrip("\n")) and "first" in once
    twice = sections.replace(once, "branching", "second")
    assert "second" in twice and "first" not in twice and twice.count("section:branching") == 2
    regenerated = "# Title\n\nnew body\n"
    carried = sections.carry(twice, regenerated)
    assert "new body" in carried and "second" in carried
    assert sections.carry(twice, twice) == twice
