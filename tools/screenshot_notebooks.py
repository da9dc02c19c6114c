"""Render the committed notebooks as a reader meets them with no kernel (nbconvert's static HTML, the
view GitHub and nbviewer give) and take a real-browser screenshot of each, to look at.

    .venv/bin/python tools/screenshot_notebooks.py [NAME ...]   -> build/notebook-screens/NAME.png

Why: issue 16 asks that every notebook shows its pictures with no kernel running, and that a person
looks at each one in a browser. The screenshots are for looking, not for the repository (build/ is
ignored). Debian's chromium is driven through playwright, as the panel's browser test does (no browser
download). Long notebooks are cut into pages of `--page-height` pixels, NAME-1.png, NAME-2.png, ...,
so each picture stays legible."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "notebook-screens"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def to_html(nb: Path, out_dir: Path) -> Path:
    subprocess.run([sys.executable, "-m", "nbconvert", "--to", "html", "--output-dir", str(out_dir), str(nb)],
                   check=True, capture_output=True)
    return out_dir / (nb.stem + ".html")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="notebook names or prefixes (default: all)")
    ap.add_argument("--width", type=int, default=1100)
    ap.add_argument("--page-height", type=int, default=2400)
    a = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    nbs = sorted((ROOT / "notebooks").glob("*.ipynb"))
    if a.names:
        nbs = [p for p in nbs if any(p.stem.startswith(n) for n in a.names)]
    OUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        page = browser.new_page(viewport={"width": a.width, "height": a.page_height})
        # the static HTML links MathJax / require.js from a CDN: offline, and not needed to see the pictures
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:") else route.abort())
        for nb in nbs:
            html = to_html(nb, OUT)
            page.goto(html.as_uri(), wait_until="load", timeout=120_000)
            height = page.evaluate("document.documentElement.scrollHeight")
            n_img = page.evaluate("Array.from(document.images).filter(i => i.complete && i.naturalWidth > 0).length")
            pages = []
            for k, top in enumerate(range(0, height, a.page_height), 1):
                path = OUT / f"{nb.stem}-{k}.png"
                page.screenshot(path=str(path), clip={"x": 0, "y": top, "width": a.width,
                                                      "height": min(a.page_height, height - top)}, full_page=True,
                                timeout=300_000)
                pages.append(path.name)
            print(f"{nb.name}: {n_img} picture(s) shown, {height} px -> {', '.join(pages)}")
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
