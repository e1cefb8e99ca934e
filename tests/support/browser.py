"""A page loaded in headless Chromium, as a reader's browser would: the images it shows."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

# Appended to a copy of the page: after load, each <img>'s id (or "img") and natural size,
# BROKEN where it did not load, in a <pre id="image-check">.
IMAGE_CHECK = """<script>window.addEventListener('load', () => {
  const sizes = [...document.images].map(i => (i.id || 'img') + '=' +
    (i.complete && i.naturalWidth > 0 ? i.naturalWidth + 'x' + i.naturalHeight : 'BROKEN'));
  const out = document.createElement('pre'); out.id = 'image-check';
  out.textContent = sizes.join(' ') || 'NONE'; document.body.appendChild(out);
});</script>"""


def load_in_chromium(page: Path) -> tuple[list[tuple[str, str]], str]:
    """PAGE loaded in headless Chromium: each <img>'s (id, natural size or BROKEN), in page
    order, and the DOM as Chromium left it."""
    checked = page.with_name(page.stem + "-check.html")
    checked.write_text(page.read_text().replace("</body>", IMAGE_CHECK + "</body>"))
    try:
        proc = subprocess.run(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu",
             "--virtual-time-budget=10000", "--dump-dom", checked.as_uri()],
            capture_output=True, text=True, timeout=120)
    finally:
        checked.unlink()
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r'<pre id="image-check">([^<]*)</pre>', proc.stdout)
    assert found, "the page never finished loading"
    images = [tuple(item.split("=", 1)) for item in found.group(1).split() if item != "NONE"]
    return images, proc.stdout
