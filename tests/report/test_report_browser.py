"""`gemmrl report`'s HTML page in a headless browser: at desktop, laptop and phone widths the verdict lines, the
per-shape table and every figure are laid out with no two text boxes overlapping, no table cell's text spilling out
of its cell and every image inside the viewport's width; a full-page screenshot is taken and must be a non-blank PNG.

Needs playwright and a Chromium it can drive (``pip install playwright && python -m playwright install chromium``,
or a system ``chromium``/``chromium-headless-shell``, or GEMMRL_CHROMIUM=<executable>); skipped, with the reason,
where there is none. The heatmaps are matplotlib images: their labels are checked on the figure objects
(test_heatmap.py); this test checks the page around them."""

from __future__ import annotations

import csv
import os
import shutil
import struct
import zlib

import pytest

from gemmrl.cli.main import main
from gemmrl.results import COLUMNS
from gemmrl.summary import BASELINES

SHAPES = ("64_4096_4096", "128_4096_14336", "1_8192_8192", "4096_4096_4096", "16_1024_16384", "2048_12288_4096")
WIDTHS = {"desktop": (1280, 900), "laptop": (1024, 768), "phone": (390, 844)}
ALGO = "eager=triton:tiled(BM=64,BN=128,BK=64,warps=4,stages=4,group_m=8) (offline entry); graph=cublaslt_tn (raced)"

# every text box on the page (one per line a text node wraps to), every table cell against its own text, every image
_LAYOUT_JS = """() => {
  const boxes = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  let i = 0;
  while (walker.nextNode()) {
    const node = walker.currentNode;
    if (!node.textContent.trim()) continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    for (const r of range.getClientRects()) {
      if (r.width > 0 && r.height > 0)
        boxes.push({id: i, text: node.textContent.trim().slice(0, 40), x: r.left, y: r.top + scrollY, w: r.width, h: r.height});
    }
    i++;
  }
  const spill = [];
  for (const cell of document.querySelectorAll('td, th')) {
    const c = cell.getBoundingClientRect();
    const range = document.createRange();
    range.selectNodeContents(cell);
    const t = range.getBoundingClientRect();
    if (t.width && (t.left < c.left - 0.5 || t.right > c.right + 0.5)) spill.push(cell.textContent.slice(0, 40));
  }
  const images = [...document.images].map(im => {
    const r = im.getBoundingClientRect();
    return {alt: im.alt, left: r.left, right: r.right, w: r.width, h: r.height, natural: im.naturalWidth};
  });
  return {boxes, spill, images, width: document.documentElement.clientWidth,
          scrollWidth: document.documentElement.scrollWidth,
          verdict: [...document.querySelectorAll('li')].map(li => li.textContent),
          tables: document.querySelectorAll('table').length};
}"""


def _row(mnk, cand, tflops, proto, **kw):
    m, n, k = (int(x) for x in mnk.split("_"))
    r = {c: "" for c in COLUMNS}
    r.update(mnk=mnk, dtype="fp16", acc="fp32", layout="tn", candidate=cand, protocol=proto, tflops=f"{tflops:.4f}",
             time_ms=f"{2 * m * n * k / (tflops * 1e9):.6f}", n="10", verified="true", gpu="NVIDIA H200", cc="9.0",
             git_sha="abc1234def56", timestamp="2026-11-29T00:00:00Z", M=str(m), N=str(n), K=str(k),
             floor_ms="1e-6", floor_ok="true", rep="0", algo=ALGO if cand == "gemmrl" else "")
    r.update(kw)
    return r


def _results(path):
    rows = []
    for i, mnk in enumerate(SHAPES):
        for proto in ("graph", "cold", "offline"):
            vendor = {b: 300.0 + 37 * ((i + j) % 5) for j, b in enumerate(BASELINES)}
            rows += [_row(mnk, b, v, proto) for b, v in vendor.items()]
            rows.append(_row(mnk, "gemmrl", max(vendor.values()) * (0.9 + 0.04 * i), proto))
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return path


def _executable() -> str | None:
    exe = os.environ.get("GEMMRL_CHROMIUM")
    if exe:
        return exe
    for name in ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser():
    sync = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    with sync.sync_playwright() as pw:
        try:
            b = pw.chromium.launch()
        except Exception as bundled:  # no browser downloaded for playwright: a system Chromium will do
            exe = _executable()
            if exe is None:
                pytest.skip(f"no Chromium for playwright ({str(bundled).splitlines()[0]}); run `python -m playwright "
                            "install chromium` or set GEMMRL_CHROMIUM")
            b = pw.chromium.launch(executable_path=exe)
        yield b
        b.close()


@pytest.fixture(scope="module")
def page_html(tmp_path_factory):
    pytest.importorskip("matplotlib")
    d = tmp_path_factory.mktemp("report")
    assert main(["report", str(_results(d / "r.csv")), "--out", str(d / "out")]) == 0
    return d / "out" / "report.html"


def _overlaps(boxes, tol=1.0):
    """Pairs of boxes of different text nodes that share more than ``tol`` px in both directions."""
    out = []
    boxes = sorted(boxes, key=lambda b: b["y"])
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            if b["y"] >= a["y"] + a["h"] - tol:
                break
            if a["id"] == b["id"]:
                continue
            dx = min(a["x"] + a["w"], b["x"] + b["w"]) - max(a["x"], b["x"])
            dy = min(a["y"] + a["h"], b["y"] + b["h"]) - max(a["y"], b["y"])
            if dx > tol and dy > tol:
                out.append((a["text"], b["text"]))
    return out


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("width", list(WIDTHS))
def test_report_page_layout_in_a_browser(browser, page_html, tmp_path, width):
    w, h = WIDTHS[width]
    page = browser.new_page(viewport={"width": w, "height": h})
    page.goto(page_html.as_uri())
    page.wait_for_load_state("load")
    got = page.evaluate(_LAYOUT_JS)
    shot = tmp_path / f"report_{width}.png"
    page.screenshot(path=str(shot), full_page=True)
    page.close()
    assert any(v.startswith("graph: gemmrl.mm / vendor_best geomean") for v in got["verdict"]), got["verdict"]
    assert got["tables"] >= 3 and len(got["boxes"]) > 100
    assert not _overlaps(got["boxes"]), _overlaps(got["boxes"])[:5]
    assert not got["spill"], got["spill"][:5]
    assert got["images"] and all(im["natural"] > 0 and im["w"] > 0 and im["h"] > 0 for im in got["images"])
    out = [im["alt"] for im in got["images"] if im["left"] < -0.5 or im["right"] > got["width"] + 0.5]
    assert not out, f"images outside the {w}px viewport: {out}"
    assert got["scrollWidth"] <= got["width"], f"the page scrolls sideways at {w}px ({got['scrollWidth']}px wide)"
    data = shot.read_bytes()
    sw, sh = _png_size(data)
    assert sw == w and sh > h and len(zlib.compress(data)) > 10_000  # the whole page, not a blank frame


@pytest.mark.parametrize("style,what", [("h2{margin-bottom:-1.2em}", "overlap"), ("td{max-width:3em;overflow:hidden;"
                                                                                   "white-space:nowrap}", "spill"),
                                        ("body{min-width:2000px}", "sideways")])
def test_the_layout_check_sees_a_broken_page(browser, page_html, tmp_path, style, what):
    """The same page with one planted layout fault: the check above must see it."""
    broken = tmp_path / "broken.html"
    broken.write_text(page_html.read_text().replace("</style>", style + "</style>"))
    page = browser.new_page(viewport={"width": 1024, "height": 768})
    page.goto(broken.as_uri())
    got = page.evaluate(_LAYOUT_JS)
    page.close()
    seen = {"overlap": bool(_overlaps(got["boxes"])), "spill": bool(got["spill"]),
            "sideways": got["scrollWidth"] > got["width"]}
    assert seen[what], seen
