"""The model evaluation in reports: ``model-eval.json``, a ``model-eval.html`` page, the report section.

:func:`section_view` (:mod:`kvx_conformance.report.model_eval`) is what
``report/templates/model_eval.html.j2`` renders: included
by the main report when a results.json carries ``model_eval`` rows
(``kvx-conform model-eval --add-to results.json``), or alone as a page
(``kvx-conform model-eval --output-dir DIR``).
"""
from __future__ import annotations

import html
import json
from pathlib import Path

from ..report.model_eval import section_view

JSON_NAME = "model-eval.json"
HTML_NAME = "model-eval.html"
RESULTS_KEY = "model_eval"


_PAGE_CSS = (
    "body{font:14px/1.45 system-ui,sans-serif;margin:2em;color:#1b1b1b}table{border-collapse:collapse;margin:.6em 0}"
    "th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left}.num{text-align:right}"
    "thead th{background:#f2f2f2}.note{color:#555;font-size:90%}.mono{font-family:monospace}"
)


def _environment():
    import jinja2

    from ..report import TEMPLATES

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                              autoescape=jinja2.select_autoescape(["html", "j2"]), undefined=jinja2.StrictUndefined)


def render_section(rows: list[dict]) -> str:
    import markupsafe

    return _environment().get_template("model_eval.html.j2").render(model_eval=section_view(rows),
                                                                    markup=markupsafe.Markup)


def page_html(rows: list[dict], title: str = "kvx-conform model-eval") -> str:
    return (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_PAGE_CSS}</style></head><body>\n{render_section(rows)}\n</body></html>\n")


def write_outputs(rows: list[dict], out_dir: Path) -> list[Path]:
    """``DIR/model-eval.json`` (``{"kind", "rows"}``) and ``DIR/model-eval.html``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    js, page = out_dir / JSON_NAME, out_dir / HTML_NAME
    js.write_text(json.dumps({"kind": "kvx-conform model-eval", "rows": rows}, indent=1) + "\n", encoding="utf-8")
    page.write_text(page_html(rows), encoding="utf-8")
    return [js, page]


def add_to_results(rows: list[dict], results_json: Path) -> Path:
    """Store the rows under ``model_eval`` in a run's results.json and re-render its report.html."""
    from ..report import write_report

    results = json.loads(results_json.read_text(encoding="utf-8"))
    results[RESULTS_KEY] = rows
    results_json.write_text(json.dumps(results, indent=1), encoding="utf-8")
    return write_report(results, results_json.with_name("report.html"))


def load_rows(path: Path) -> list[dict]:
    """Rows from a ``model-eval.json`` (or a bare JSON list of rows, as ``--json`` prints)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return data["rows"] if isinstance(data, dict) else list(data)
