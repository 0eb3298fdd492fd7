"""Open an HTML file in a real headless chromium and collect what its console printed.

Shared by the report tests. ``open_headless(path)`` copies the page, appends a small
checker (every <img> decoded, a marker written into the DOM once the load event ran),
runs ``chromium --headless --dump-dom`` with console logging to stderr, and returns
the console lines, the dumped DOM and whether the checker ran. Tests skip only when
no chromium is installed (``.ci/run`` installs Debian's).
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
MARKER = "kvx-browser-check-done"
CHECKER = """
<script>
window.addEventListener("load", function () {
  var imgs = document.images, bad = 0;
  for (var i = 0; i < imgs.length; i++) {
    if (!imgs[i].complete || imgs[i].naturalWidth === 0) { bad++; console.error("broken image: " + (imgs[i].alt || i)); }
  }
  var m = document.createElement("div");
  m.id = "%s"; m.setAttribute("data-images", imgs.length); m.setAttribute("data-broken", bad);
  document.body.appendChild(m);
});
</script>
""" % MARKER
CONSOLE_RE = re.compile(r"CONSOLE[:(]\d*\)?\]?\s*(.*)")


@dataclass
class PageResult:
    console: list[str]
    dom: str
    checked: bool
    images: int
    broken: int
    returncode: int
    stderr_tail: str


def chromium() -> str | None:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def open_headless(html: str | Path, timeout: float = 90.0) -> PageResult:
    exe = chromium()
    if exe is None:
        raise RuntimeError("no chromium found")
    src = Path(html).read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="kvx-browser-") as tmp:
        page = Path(tmp) / "page.html"
        i = src.lower().rfind("</body>")
        page.write_text(src[:i] + CHECKER + src[i:] if i >= 0 else src + CHECKER, encoding="utf-8")
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--no-first-run", "--disable-extensions", f"--user-data-dir={tmp}/profile",
               "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", "--dump-dom", page.as_uri()]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    console = [m.group(1) for line in p.stderr.splitlines() if (m := CONSOLE_RE.search(line))]
    m = re.search(r'id="%s"[^>]*data-images="(\d+)"[^>]*data-broken="(\d+)"' % MARKER, p.stdout)
    return PageResult(console=console, dom=p.stdout, checked=m is not None,
                      images=int(m.group(1)) if m else 0, broken=int(m.group(2)) if m else -1,
                      returncode=p.returncode, stderr_tail="\n".join(p.stderr.splitlines()[-15:]))
