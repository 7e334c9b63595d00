#!/usr/bin/env python3
"""Rebuild llama31_405b/data/corpus/tiny_corpus.jsonl.xz from three Debian 12 documentation packages.

The tiny corpus ships in the repository (so `make demo` downloads nothing); this script documents
and reproduces how it was made. It needs `apt-get download` (Debian/Ubuntu, package lists updated)
and writes one JSON object per line: {"text": ..., "source": ..., "url": ...}.

Sources (all permissively licensed English web documentation, the kind of page C4 crawls):
  python3.11-doc     Python 3.11 documentation           PSF License Version 2
  postgresql-doc-15  PostgreSQL 15 manual                PostgreSQL License (BSD-style)
  sqlite3-doc        SQLite documentation                public domain

Cleaning follows C4's spirit, simplified: visible text of each HTML page without scripts, styles,
navigation, tables and code blocks (<pre>); paragraphs with fewer than 4 words or a curly brace
are dropped; paragraphs seen more than 3 times in the corpus (page boilerplate) are dropped; a page
is split into one document per h1-h3 section, keeping sections of at least 3 paragraphs.

usage: python scripts/build_tiny_corpus.py [--debs DIR] [--out PATH]
"""
from __future__ import annotations

import argparse
import collections
import json
import lzma
import os
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

PACKAGES = {  # package -> (source label, html root inside the package)
    "python3.11-doc": ("python-docs", "usr/share/doc/python3.11/html"),
    "postgresql-doc-15": ("postgresql-docs", "usr/share/doc/postgresql-doc-15/html"),
    "sqlite3-doc": ("sqlite-docs", "usr/share/doc/sqlite3"),
}
BLOCK = {"p", "div", "h1", "h2", "h3", "h4", "h5", "li", "br", "tr", "dt", "dd", "table",
         "section", "blockquote", "title"}
HEADINGS = {"h1", "h2", "h3"}
SKIP = {"script", "style", "pre", "head", "nav", "table"}


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paras: list[tuple[bool, str]] = []  # (is_heading, text)
        self._cur: list[str] = []
        self._skip = 0

    def _flush(self, heading: bool = False) -> None:
        text = " ".join("".join(self._cur).split())
        self._cur = []
        if text:
            self.paras.append((heading, text))

    def handle_starttag(self, tag, attrs):
        if tag in SKIP:
            self._skip += 1
        if tag in BLOCK:
            self._flush()

    def handle_endtag(self, tag):
        if tag in SKIP and self._skip:
            self._skip -= 1
        if tag in BLOCK:
            self._flush(tag in HEADINGS)

    def handle_data(self, data):
        if not self._skip:
            self._cur.append(data)


def _sections(path: Path) -> list[list[str]]:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8", errors="replace"))
    page._flush()
    out, cur = [], []
    for heading, text in page.paras:
        if heading:
            out.append(cur)
            cur = []
        elif len(text.split()) >= 4 and "{" not in text:
            cur.append(text)
    out.append(cur)
    return [s for s in out if s]


def build(debs: Path, out: Path) -> None:
    pages = []
    for pkg, (label, root) in PACKAGES.items():
        deb = sorted(debs.glob(f"{pkg}_*.deb"))
        if not deb:
            sys.exit(f"missing {pkg}_*.deb in {debs}: run `apt-get download {pkg}` there")
        tree = debs / pkg
        subprocess.run(["dpkg-deb", "-x", str(deb[-1]), str(tree)], check=True)
        base = tree / root
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            if "_sources" in dirpath:
                continue
            for name in sorted(filenames):
                if name.endswith(".html"):
                    p = Path(dirpath) / name
                    pages.append((label, str(p.relative_to(base)), _sections(p)))
        print(f"{deb[-1].name}: {sum(1 for x in pages if x[0] == label)} pages", file=sys.stderr)
    seen = collections.Counter(t for _, _, secs in pages for s in secs for t in s)
    n_docs = n_words = 0
    with lzma.open(out, "wt", encoding="utf-8", preset=9 | lzma.PRESET_EXTREME) as f:
        for label, url, secs in pages:
            for s in secs:
                kept = [t for t in s if seen[t] <= 3]
                if len(kept) >= 3:
                    text = "\n".join(kept)
                    f.write(json.dumps({"text": text, "source": label, "url": url},
                                       ensure_ascii=False) + "\n")
                    n_docs += 1
                    n_words += len(text.split())
    print(f"wrote {out}: {n_docs} documents, {n_words} words, {out.stat().st_size} bytes",
          file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--debs", type=Path, help="folder holding the three .deb files "
                    "(default: download them into a temporary folder)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1]
                    / "llama31_405b/data/corpus/tiny_corpus.jsonl.xz")
    args = ap.parse_args()
    if args.debs:
        build(args.debs, args.out)
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["apt-get", "download", *PACKAGES], cwd=tmp, check=True)
        build(Path(tmp), args.out)


if __name__ == "__main__":
    main()
