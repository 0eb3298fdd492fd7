"""What the bench's HTML pages share: matplotlib (headless) and inline PNGs, byte counts in words."""
from __future__ import annotations

import base64
import io


def plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def png(fig) -> str:
    """The figure as an inline ``data:`` PNG (the pages are self-contained); the figure is closed."""
    import warnings

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt().close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return str(n)


def _num(fmt: str, scale: float = 1.0):
    return lambda x: "-" if x is None else format(x * scale, fmt)


def jinja_env(templates):
    """A jinja2 environment over the folder ``templates`` with the number filters the bench's
    pages share ("-" for a missing value): ``f1`` ``f2`` ``f3`` (decimals), ``pct`` (a fraction
    as a percentage), ``gb`` (bytes/s as GB/s), ``us`` (seconds as microseconds), ``mb``,
    ``mib``, ``bytes`` (:func:`fmt_bytes`)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates)), autoescape=True,
                             undefined=jinja2.ChainableUndefined)
    env.filters.update(f1=_num(".1f"), f2=_num(".2f"), f3=_num(".3f"), pct=lambda x: "-" if x is None else f"{100 * x:.1f}%",
                       gb=_num(".0f", 1e-9), us=_num(".2f", 1e6), mb=_num(".1f", 1e-6), mib=_num(".0f", 2.0 ** -20),
                       bytes=fmt_bytes)
    return env
