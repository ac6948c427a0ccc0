"""The relative links of a Markdown source, and the anchors its headings make, as GitHub reads
them: one rule for the site's hook (which rewrites them for the pages it builds) and for the
test that each resolves where the sources are read as files (tests/test_docs.py).

The site's headings get GitHub's anchors too: mkdocs.yml's `toc` slugify is
`pymdownx.slugs.slugify(case="lower")`, the rule `slug` writes out (lower case, every
character but a letter, digit, `_`, `-` or space dropped, each space a `-`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterator

# fenced blocks and code spans: what they show is text, never a link or a heading
_FENCE = re.compile(r"^([ \t]*)(`{3,}|~{3,})[^\n]*\n.*?^\1\2[ \t]*$", re.MULTILINE | re.DOTALL)
_SPAN = re.compile(r"(?<!`)(`+)(?!`).+?(?<!`)\1(?!`)", re.DOTALL)
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
# `[text](target "title")` and `![alt](target)` (any link whose text ends `](`), a reference
# definition `[name]: target`, an HTML `<a href>` or `<img src>`
_TARGETS = (
    re.compile(r"\]\(\s*<?(?P<target>[^)\s>]+)"),
    re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(?P<target>[^\s>]+)", re.MULTILINE),
    re.compile(r"""<(?:a|img)\b[^>]*?\b(?:href|src)=["'](?P<target>[^"']+)["']"""),
)
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$", re.MULTILINE)


def _blank(match: re.Match) -> str:
    return re.sub(r"[^\n]", " ", match[0])


def prose(markdown: str) -> str:
    """The text with its code and comments blanked (each character a space, so offsets hold)."""
    for pattern in (_FENCE, _SPAN, _COMMENT):
        markdown = pattern.sub(_blank, markdown)
    return markdown


def relative(target: str) -> bool:
    """Whether a link's target is a file of the same tree (not a URL, a mail, nor `#anchor`)."""
    return not (re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("/", "#")))


def targets(markdown: str) -> Iterator[re.Match]:
    """Each link's match (its `target` group) in the text outside code, in order."""
    text = prose(markdown)
    found = [m for pattern in _TARGETS for m in pattern.finditer(text)]
    yield from sorted(found, key=lambda m: m.start("target"))


def rewrite(markdown: str, move: Callable[[str], str]) -> str:
    """The text with each relative link's target replaced by `move(target)`."""
    out, at = [], 0
    for match in targets(markdown):
        start, end = match.span("target")
        target = markdown[start:end]
        if relative(target):
            out += [markdown[at:start], move(target)]
            at = end
    return "".join([*out, markdown[at:]])


def slug(heading: str) -> str:
    """The anchor GitHub (and the site, as configured) gives a heading's Markdown text."""
    text = re.sub(r"\s*\{[^}]*\}\s*$", "", heading)  # an attr_list `{ #id }`: not GitHub's
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link: its text
    text = re.sub(r"<[^>]*>", "", text.replace("`", "").replace("*", ""))
    text = unicodedata.normalize("NFC", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings(markdown: str) -> list[str]:
    """The text of each ATX heading (`## text`) outside fenced blocks and comments."""
    return [m[2] for m in _HEADING.finditer(_COMMENT.sub("", _FENCE.sub("", markdown)))]


def anchors(markdown: str) -> set[str]:
    """The anchors of a Markdown source's headings (GitHub numbers a repeated one `-1`, `-2`)
    and of its HTML elements' `id` or `name`."""
    found, seen = set(), {}
    text = _COMMENT.sub("", _FENCE.sub("", markdown))
    for heading in headings(text):
        base = slug(heading)
        found.add(f"{base}-{seen[base]}" if base in seen else base)
        seen[base] = seen.get(base, 0) + 1
    return found | set(re.findall(r"""\b(?:id|name)=["']([^"']+)["']""", text))
