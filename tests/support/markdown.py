"""Markdown as the docs tests read it: headings, their anchors, links."""

import re

_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def headings(markdown: str) -> list[str]:
    """Heading texts, leaving out lines that only look like one in a code block."""
    return _HEADING.findall(_FENCE.sub("", markdown))


def anchor(heading: str) -> str:
    """The anchor GitHub (and most renderers) give a heading: lower case,
    punctuation other than `-` and `_` dropped, spaces to `-`."""
    plain = re.sub(r"[`*_]", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", plain).replace(" ", "-")


def heading_anchors(markdown: str) -> set[str]:
    return {anchor(heading) for heading in headings(markdown)}
