"""The documentation site loads nothing from the network: no page, template or stylesheet
of the built site fetches an asset (script, stylesheet, image, font, frame) from a CDN.
The mkdocs theme's highlight.js came from cdnjs on every page; code is now highlighted at
build time (codehilite over Pygments) with a local stylesheet.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# An element that fetches what it names, and CSS that fetches (url(...) / @import of http).
REMOTE_ASSET = re.compile(r"<(?:script|link|img|iframe|source|video|audio|embed)\b[^>]*?(?:src|href|srcset)=[\"']?"
                          r"(?:https?:)?//", re.I)
REMOTE_CSS = re.compile(r"(?:url\(\s*[\"']?|@import\s+[\"']?)(?:https?:)?//", re.I)


def test_built_site_fetches_no_remote_asset(tmp_path):
    pytest.importorskip("mkdocs")
    yaml = pytest.importorskip("yaml")
    theme = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["theme"]
    assert theme.get("highlightjs") is False, "the mkdocs theme loads highlight.js from a CDN"
    mkdocs = Path(sys.executable).with_name("mkdocs")
    cmd = [str(mkdocs)] if mkdocs.exists() else [sys.executable, "-m", "mkdocs"]
    site = tmp_path / "site"
    # --no-strict (mkdocs.yml sets strict): a broken link is test_docs' failure; this one's is a remote asset.
    r = subprocess.run([*cmd, "build", "--no-strict", "--site-dir", str(site)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    pages = list(site.rglob("*.html"))
    assert pages and 'class="codehilite"' in (site / "integrations" / "langchain" / "index.html").read_text()
    for path in pages:
        hit = REMOTE_ASSET.search(path.read_text(encoding="utf-8", errors="replace"))
        assert hit is None, f"{path.relative_to(site)} loads {hit.group(0)!r}"
    for path in site.rglob("*.css"):
        hit = REMOTE_CSS.search(path.read_text(encoding="utf-8", errors="replace"))
        assert hit is None, f"{path.relative_to(site)} fetches {hit.group(0)!r}"
