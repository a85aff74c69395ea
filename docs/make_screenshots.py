"""Screenshots of a report.html for the docs: parts of the page (from one section to the next,
or a height from a section) at 1280 px, stacked into one palette PNG small enough to commit.

    python docs/make_screenshots.py results/<run>/report.html docs/report-pass.png \\
        --part verdict:levels --part mismatches+1200
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests import chromium  # noqa: E402  (the repository root is on the path only now)

WIDTH = 1280
# Writes the top of every <section>/<header> with an id, and the page height.
OFFSETS = """
(function () {
  const r = {height: document.documentElement.scrollHeight};
  document.querySelectorAll("section[id], header[id]").forEach(function (el) {
    r[el.id] = Math.round(el.getBoundingClientRect().top + window.scrollY);
  });
  const out = document.createElement("pre");
  out.id = "rig-browser-check";
  out.textContent = JSON.stringify(r);
  document.body.appendChild(out);
})();
"""


def crop_box(part: str, offsets: dict[str, int]) -> tuple[int, int]:
    """`a:b` from section a's top to section b's top; `a+N` N px from a's top."""
    if "+" in part:
        start, height = part.split("+")
        top = offsets[start] - 8
        return top, min(top + int(height), offsets["height"])
    start, _, end = part.partition(":")
    top = offsets[start] - 8 if start else 0
    return top, (offsets[end] - 8 if end else offsets["height"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--part", action="append", default=[], help="a:b or a+PIXELS")
    parser.add_argument("--colours", type=int, default=128, help="palette size of the PNG")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        checked = chromium.with_check_script(args.report, OFFSETS, work / "offsets.html")
        offsets = chromium.check_result(chromium.dump_dom(checked, work / "profile", WIDTH))
        height = min(offsets["height"] + 16, 16_000)
        shot = chromium.screenshot(args.report, work / "page.png", work / "profile", WIDTH, height)
        page = Image.open(shot).convert("RGB")
    boxes = [crop_box(part, offsets) for part in args.part or [":"]]
    pieces = [page.crop((0, top, WIDTH, min(bottom, page.height))) for top, bottom in boxes]
    gap = 6
    sheet = Image.new("RGB", (WIDTH, sum(p.height for p in pieces) + gap * (len(pieces) - 1)))
    sheet.paste((150, 150, 150), (0, 0, sheet.width, sheet.height))
    y = 0
    for piece in pieces:
        sheet.paste(piece, (0, y))
        y += piece.height + gap
    sheet.quantize(args.colours).save(args.out, optimize=True)
    print(f"{args.out}: {sheet.width}x{sheet.height}, {args.out.stat().st_size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
