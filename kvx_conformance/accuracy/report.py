"""The accuracy section of the HTML report as a page of its own (``kvx-conform accuracy --html``).

``standalone_html(rows)`` renders ``accuracy.html.j2`` with the section's view
(``section_view(rows)`` of :mod:`kvx_conformance.report.accuracy`, which the main report
uses when a results.json carries an ``accuracy`` list).
"""
from __future__ import annotations

import html

from ..report.accuracy import section_view


def render_section(rows: list[dict]) -> str:
    import jinja2

    from ..report import TEMPLATES

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             autoescape=jinja2.select_autoescape(["html", "j2"]), undefined=jinja2.StrictUndefined)
    return env.get_template("accuracy.html.j2").render(accuracy=section_view(rows), markup=_markup)


def _markup(s: str):
    import markupsafe

    return markupsafe.Markup(s)


def standalone_html(rows: list[dict], title: str = "kvx-conform accuracy") -> str:
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + html.escape(title) +
            "</title><style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:.5em 0 1.5em}"
            "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td:first-child,th:first-child{text-align:left}"
            ".note{color:#555}</style></head><body>" + render_section(rows) + "</body></html>\n")
