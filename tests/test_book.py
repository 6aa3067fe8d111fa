"""The web book (``minigraph book OUT``), built once per session and read in a real browser.

The build runs the CLI in a subprocess, so its progress lines and exit status are what a
reader sees. The checks that need no browser crawl the HTML: every page is reachable from
``index.html``, no local link is broken, and nothing is loaded from the network. The
browser checks open pages in headless Chromium through a small harness page that loads
the book page in an iframe (``--allow-file-access-from-files`` lets it look inside) and
writes what it finds into its own DOM, which ``--dump-dom`` prints: the MathJax SVG
elements, every image's natural width, the search page's results. A screenshot of each
page is saved under ``build/book-screenshots/`` (or ``$MINIGRAPH_BOOK_SCREENSHOTS``).

Notebook outputs are cached in ``build/book-cache/`` (jupyter-cache), so a second run on
the same checkout does not execute unchanged notebooks again; CI starts without it.
"""

from __future__ import annotations

import html.parser
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MISSING = [m for m in ("sphinx", "myst_nb", "sphinx_book_theme", "mathjax")
           if importlib.util.find_spec(m) is None]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(bool(MISSING), reason=f"the docs extra is missing ({', '.join(MISSING)}): "
                                             "pip install -e '.[docs]'"),
]
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed (as root: bash .ci/book-deps)")

CHAPTERS = sorted(p.parent.name for p in ROOT.glob("chapters/[0-9][0-9]-*/README.md"))
NOTEBOOKS = sorted(p.stem for p in ROOT.glob("notebooks/[0-9][0-9]-*.ipynb"))


@pytest.fixture(scope="session")
def book(tmp_path_factory):
    """(the site's folder, the build's output), built once."""
    out = tmp_path_factory.mktemp("book") / "site"
    cache = ROOT / "build" / "book-cache"
    env = dict(os.environ, MINIGRAPH_BOOK_CACHE=str(cache))
    env.pop("MPLBACKEND", None)  # the build sets the kernels' backend itself
    proc = subprocess.run([sys.executable, "-m", "minigraph.cli", "book", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=880)
    assert proc.returncode == 0, f"minigraph book failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return out, proc.stdout


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[tuple[str, str]] = []  # (tag, url)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("href", "src"):
            if a.get(key):
                self.links.append((tag, a[key]))


def links(page: Path) -> list[tuple[str, str]]:
    p = _Links()
    p.feed(page.read_text(encoding="utf-8"))
    return p.links


def test_build_prints_a_line_per_notebook(book):
    _, stdout = book
    for nb in NOTEBOOKS:
        assert re.search(rf"notebook \d+/{len(NOTEBOOKS)}: notebooks/{re.escape(nb)}\.ipynb", stdout), stdout


def test_every_page_is_reachable_and_no_link_is_broken(book):
    site, _ = book
    assert (site / "index.html").exists()
    seen, todo, broken = set(), [site / "index.html"], []
    while todo:
        page = todo.pop()
        if page in seen:
            continue
        seen.add(page)
        for tag, url in links(page):
            parts = urlsplit(url)
            if parts.scheme or url.startswith(("#", "//", "mailto:")):
                continue
            target = (page.parent / unquote(parts.path)).resolve()
            if not target.exists():
                broken.append(f"{page.relative_to(site)}: <{tag}> {url}")
            elif target.suffix == ".html" and tag == "a":
                todo.append(target)
    assert not broken, "broken local links:\n" + "\n".join(broken[:30])
    reached = {p.relative_to(site).as_posix() for p in seen}
    wanted = (["README.html", "search.html", "source/index.html",
               "source/minigraph/graph/gradients.py.html"]
              + [f"chapters/{c}/README.html" for c in CHAPTERS]
              + [f"source/chapters/{c}/exercises.py.html" for c in CHAPTERS if (ROOT / "chapters" / c / "exercises.py").exists()]
              + [f"notebooks/{n}.html" for n in NOTEBOOKS])
    missing = [w for w in wanted if w not in reached]
    assert not missing, f"pages not reachable from index.html by links: {missing}"


def test_each_chapter_links_its_notebook_exercises_and_modules(book):
    site, _ = book
    for c in CHAPTERS:
        urls = [u for tag, u in links(site / "chapters" / c / "README.html") if tag == "a"]
        nb = [n for n in NOTEBOOKS if n[:2] == c[:2]]
        if nb:
            assert any(u.endswith(f"notebooks/{nb[0]}.html") for u in urls), c
            back = [u for tag, u in links(site / "notebooks" / f"{nb[0]}.html") if tag == "a"]
            assert any(u.endswith(f"chapters/{c}/README.html") for u in back), nb[0]
        assert any(u.endswith("exercises.py.html") for u in urls), c
        assert any("source/minigraph/" in u and u.endswith(".py.html") for u in urls), c


def test_nothing_is_loaded_from_the_network(book):
    site, _ = book
    remote = []
    for page in site.rglob("*.html"):
        for tag, url in links(page):
            if tag in ("script", "link", "img", "iframe") and re.match(r"^(https?:)?//", url):
                remote.append(f"{page.relative_to(site)}: <{tag}> {url}")
    assert not remote, "the book must work offline:\n" + "\n".join(sorted(set(remote))[:20])
    assert (site / "_static" / "mathjax" / "tex-svg.js").exists()


# -- in the browser ---------------------------------------------------------------------------

HARNESS = """<!DOCTYPE html><html><body style="margin:0">
<pre id="result" style="height:1.2em;overflow:hidden;margin:0">pending</pre>
<iframe id="page" src="%s" style="width:1280px;height:1700px;border:0"></iframe>
<script>
const frame = document.getElementById("page");
let tries = 0;
function report(r) { document.getElementById("result").textContent = JSON.stringify(r); }
function check() {
  tries += 1;
  const d = frame.contentDocument, w = frame.contentWindow;
  if (!d) return report({error: "no access to the page from the harness"});
  const imgs = Array.from(d.images);
  const searching = d.getElementById("search-results") && !d.querySelector(".search-summary");
  if ((d.readyState !== "complete" || !imgs.every(i => i.complete) || searching) && tries < 150)
    return setTimeout(check, 100);
  const typeset = w.MathJax && w.MathJax.startup && w.MathJax.startup.promise || Promise.resolve();
  typeset.then(() => report({
    title: d.title,
    images: imgs.map(i => ({src: i.getAttribute("src"), width: i.naturalWidth})),
    mathjax_svg: !!(w.MathJax && w.MathJax.config && w.MathJax.startup && w.MathJax.startup.output
                    && w.MathJax.startup.output.name === "SVG"),
    svg_math: d.querySelectorAll("mjx-container[jax=SVG] svg").length,
    math: d.querySelectorAll(".math").length,
    untypeset: Array.from(d.querySelectorAll(".math"))
      .filter(e => !e.querySelector("mjx-container")).map(e => e.textContent.slice(0, 80)),
    search_results: d.querySelectorAll("#search-results li").length,
  }));
}
frame.addEventListener("load", () => setTimeout(check, 50));
</script></body></html>
"""


def screenshots_dir() -> Path:
    d = Path(os.environ.get("MINIGRAPH_BOOK_SCREENSHOTS", ROOT / "build" / "book-screenshots"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def open_in_chromium(url: str, shot: Path) -> dict:
    """Load ``url`` in headless Chromium through the harness; screenshot it; return the
    harness's findings."""
    with tempfile.TemporaryDirectory(prefix="minigraph-chromium-") as tmp:
        harness = Path(tmp) / "harness.html"
        harness.write_text(HARNESS % url, encoding="utf-8")
        cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={Path(tmp) / 'profile'}", "--allow-file-access-from-files",
               "--window-size=1280,1720", "--virtual-time-budget=20000", "--hide-scrollbars",
               f"--screenshot={shot}", "--dump-dom", harness.as_uri()]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="result"[^>]*>(.*?)</pre>', proc.stdout, re.S)
    assert m, f"Chromium gave no result for {url}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    text = html.unescape(m.group(1))
    assert text != "pending", f"the page {url} did not finish loading in the browser"
    result = json.loads(text)
    assert "error" not in result, result
    return result


# (page, must it have math, must it have figures)
PAGES = [("index.html", False, False), ("README.html", False, False),
         ("chapters/{c02}/README.html", True, False), ("chapters/{c03}/README.html", False, False),
         ("source/minigraph/graph/gradients.py.html", False, False)]


def _fill(page: str) -> str:
    names = {f"c{c[:2]}": c for c in CHAPTERS} | {f"n{n[:2]}": n for n in NOTEBOOKS}
    return page.format(**names)


@needs_chromium
@pytest.mark.parametrize("page,math,figures", PAGES, ids=[p[0].split("/")[0] + "/" + p[0].split("/")[-1][:24] for p in PAGES])
def test_page_in_the_browser(book, page, math, figures):
    site, _ = book
    page = _fill(page)
    path = site / page
    assert path.exists(), page
    shot = screenshots_dir() / (page.replace("/", "__").removesuffix(".html") + ".png")
    r = open_in_chromium(path.as_uri(), shot)
    assert shot.exists() and shot.stat().st_size > 10_000, f"no screenshot of {page}"
    assert not r["untypeset"], f"{page}: math left as TeX: {r['untypeset'][:5]}"
    if math:
        assert r["mathjax_svg"], f"{page}: MathJax 3 with SVG output did not start"
        assert r["svg_math"] > 0 and r["svg_math"] >= r["math"], r
    broken = [i["src"] for i in r["images"] if i["width"] == 0]
    assert not broken, f"{page}: images that did not load: {broken}"
    if figures:
        assert sum(1 for i in r["images"] if "_images/" in i["src"]) > 0, f"{page}: no figure"


@needs_chromium
def test_search_works_offline(book):
    site, _ = book
    r = open_in_chromium((site / "search.html").as_uri() + "?q=gradient",
                         screenshots_dir() / "search.png")
    assert r["search_results"] > 0, r


@needs_chromium
@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_notebook_in_the_browser(book, nb):
    """Every notebook page: its figures (executed at build time) load, its math is
    typeset (notebook 03 has some in its text cells), nothing is left as raw TeX."""
    site, _ = book
    page = site / "notebooks" / f"{nb}.html"
    figures = len(re.findall(r'<img[^>]+src="[^"]*_images/', page.read_text(encoding="utf-8")))
    r = open_in_chromium(page.as_uri(), screenshots_dir() / f"notebooks__{nb}.png")
    assert not [i for i in r["images"] if i["width"] == 0], (nb, r["images"])
    assert sum(1 for i in r["images"] if "_images/" in i["src"]) == figures > 0, (nb, r["images"])
    assert not r["untypeset"], (nb, r["untypeset"][:5])
    if nb[:2] == "03":
        assert r["mathjax_svg"] and r["svg_math"] > 0, r
