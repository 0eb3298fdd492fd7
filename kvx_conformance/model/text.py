"""The evaluation text: English prose from CPython's own documentation, on every machine offline.

``pydoc_data.topics`` ships the language reference's topics as plain text. The
text taken is the prose paragraphs of fixed topics, in order: headings, indented
blocks (code, notes), list items and list introductions are dropped, and each
paragraph's lines are joined with single spaces. The topics change a little
between Python versions, so every result records the text's SHA-256 and length.
"""
from __future__ import annotations

import hashlib
import re

#: topics read, in order (all present since Python 3.8)
TOPICS = ("exceptions", "execmodel")

_HEADING_RULE = re.compile(r"^[*=\-~^]{3,}$")


def _prose_paragraphs(topic_text: str) -> list[str]:
    out = []
    for para in re.split(r"\n\s*\n", topic_text):
        lines = para.split("\n")
        if not para.strip() or para[0].isspace():
            continue  # indented: code, grammar, notes
        if len(lines) >= 2 and _HEADING_RULE.match(lines[-1].strip()):
            continue  # heading
        flat = " ".join(para.split())
        if flat.startswith(("* ", "-[", "[")) or not flat.endswith(".") or len(flat.split()) < 8:
            continue  # list item, footnote, list introduction, fragment
        out.append(flat)
    return out


def eval_text() -> str:
    from pydoc_data.topics import topics

    paras: list[str] = []
    for name in TOPICS:
        paras.extend(_prose_paragraphs(topics[name]))
    return "\n\n".join(paras)


def text_id(text: str) -> str:
    """A short, stable identity of the text (first 12 hex digits of its SHA-256)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
