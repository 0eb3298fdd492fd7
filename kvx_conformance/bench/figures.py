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
