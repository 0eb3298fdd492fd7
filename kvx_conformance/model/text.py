"""The evaluation texts: English prose shipped with Python and numpy, on every machine offline.

:func:`corpus` gives the texts ``model-eval`` reads (the language reference's prose from
``pydoc_data.topics``, standard-library docstrings, numpy docstrings), each with its source
and SHA-256; :func:`take_windows` cuts the evaluation's windows from their tokens. The
single text below (:func:`eval_text`, two topics) serves the short tests.

``pydoc_data.topics`` ships the language reference's topics as plain text. The
text taken is the prose paragraphs of fixed topics, in order: headings, indented
blocks (code, notes), list items and list introductions are dropped, and each
paragraph's lines are joined with single spaces. The topics change a little
between Python versions, so every result records the text's SHA-256 and length.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np

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


# ----------------------------------------------------------------------------- the evaluation corpus

#: standard-library modules whose docstrings make the second text (pure Python, present
#: since Python 3.8, no deprecation warning on import)
STDLIB_MODULES = (
    "logging", "email.message", "difflib", "doctest", "unittest.case", "threading", "urllib.request",
    "smtplib", "shutil", "inspect", "json", "statistics", "subprocess", "configparser", "http.client",
    "zipfile", "tarfile", "imaplib", "ftplib", "pathlib", "argparse", "textwrap", "random", "calendar",
)
#: modules of numpy (a dependency, so installed wherever the project is) for the third text
NUMPY_MODULES = ("numpy", "numpy.fft")


@dataclass(frozen=True)
class Text:
    """One text of the corpus, with its provenance."""

    name: str
    source: str  # where it comes from, versions included
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def _docstring_prose(module_names) -> list[str]:
    """Prose paragraphs of the docstrings of the modules, their public classes, functions and
    methods (each defined in that module), in name order."""
    import importlib
    import inspect

    paras: list[str] = []

    def add(obj) -> None:
        if isinstance(getattr(obj, "__doc__", None), str):
            paras.extend(_prose_paragraphs(inspect.cleandoc(obj.__doc__)))

    for modname in module_names:
        mod = importlib.import_module(modname)
        add(mod)
        for name in sorted(vars(mod)):
            obj = vars(mod)[name]
            if name.startswith("_") or getattr(obj, "__module__", None) != modname:
                continue
            if inspect.isclass(obj):
                add(obj)
                for attr in sorted(vars(obj)):
                    member = vars(obj)[attr]
                    if not attr.startswith("_") and inspect.isfunction(member):
                        add(member)
            elif inspect.isfunction(obj) or callable(obj) and getattr(obj, "__doc__", None):
                add(obj)
    return list(dict.fromkeys(paras))  # a paragraph shared by overloads once


def corpus() -> list[Text]:
    """The texts the evaluation reads, in order: all prose of the language reference
    (``pydoc_data.topics``), docstrings of standard-library modules, docstrings of numpy."""
    import platform

    import numpy
    from pydoc_data.topics import topics

    py = f"Python {platform.python_version()}"
    ref = [p for name in sorted(topics) for p in _prose_paragraphs(topics[name])]
    return [
        Text("python-reference", f"pydoc_data.topics, all {len(topics)} topics ({py})", "\n\n".join(ref)),
        Text("stdlib-docstrings", f"docstrings of {len(STDLIB_MODULES)} standard-library modules: "
             f"{', '.join(STDLIB_MODULES)} ({py})", "\n\n".join(_docstring_prose(STDLIB_MODULES))),
        Text("numpy-docstrings", f"docstrings of {', '.join(NUMPY_MODULES)} (numpy {numpy.__version__})",
             "\n\n".join(_docstring_prose(NUMPY_MODULES))),
    ]


@dataclass(frozen=True)
class Window:
    """``ids`` = tokens ``start .. start + len(ids)`` of text ``text``."""

    text: str
    start: int
    ids: np.ndarray


def take_windows(token_lists: dict[str, np.ndarray], n_tokens: int, window: int) -> list[Window]:
    """``n_tokens`` tokens in windows of ``window``: consecutive windows of each text, taken
    round-robin over the texts (so every text is read), the last one cut to make the total.
    A text's shorter tail comes after its whole windows."""
    if window < 2 or n_tokens < 2:
        raise ValueError("windows and the token count need at least 2 tokens")
    queues = {name: [(s, ids[s:s + window]) for s in range(0, len(ids), window)] for name, ids in token_lists.items()}
    out: list[Window] = []
    left = n_tokens
    while left > 0:
        progressed = False
        for name, q in queues.items():
            if left <= 0:
                break
            if not q:
                continue
            start, ids = q.pop(0)
            ids = ids[:left] if len(ids) > left else ids
            if len(ids) < 2:  # a one-token tail scores nothing
                continue
            out.append(Window(name, start, ids))
            left -= len(ids)
            progressed = True
        if not progressed:
            have = sum(len(w.ids) for w in out)
            raise ValueError(f"the corpus has {have} tokens in windows of {window}, {n_tokens} asked "
                             f"({', '.join(f'{k}: {len(v)}' for k, v in token_lists.items())})")
    return out
