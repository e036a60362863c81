"""Generated sections of a Markdown page that other commands own: each lies between
``<!-- section:NAME -->`` and ``<!-- /section:NAME -->``, so one command rewrites only its own
section and the page's own generator carries it over unchanged (``carry``)."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["carry", "replace", "write"]


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- section:{name} -->", f"<!-- /section:{name} -->"


def replace(text: str, name: str, body: str) -> str:
    """``text`` with section ``name`` set to ``body`` (appended at the end when absent)."""
    begin, end = _markers(name)
    block = f"{begin}\n{body.strip()}\n{end}\n"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.S)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text, count=1)
    return text.rstrip("\n") + ("\n\n" if text.strip() else "") + block


def write(page: Path, name: str, body: str) -> None:
    """Set section ``name`` of the page at ``page`` (made if absent) to ``body``."""
    text = page.read_text() if page.exists() else ""
    page.write_text(replace(text, name, body))


def carry(old: str, new: str) -> str:
    """``new`` plus every marked section of ``old`` that ``new`` lacks (kept verbatim)."""
    for match in re.finditer(r"<!-- section:([\w-]+) -->", old):
        name = match.group(1)
        begin, end = _markers(name)
        if begin in new:
            continue
        found = re.search(re.escape(begin) + r"\n(.*?)\n" + re.escape(end), old, re.S)
        if found:
            new = replace(new, name, found.group(1))
    return new
