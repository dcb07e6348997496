"""``glm5-lsp index [PATH]``: build the symbol summaries and the API-doc index ahead of time.

Shows a progress bar while it reads files and packages, then prints what it indexed. Everything is
cached (``--cache-dir``, else ``$GLM5_LSP_CACHE_DIR``, else the user cache directory), so the
language server starts warm on this workspace.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", nargs="?", default=".", help="workspace folder (default: the current folder)")
    parser.add_argument("--cache-dir", default=None, help="where to keep the cache (default: user cache dir)")
    parser.add_argument("--no-packages", action="store_true", help="skip the installed packages' API docs")
    parser.add_argument("--max-file-bytes", type=int, default=1 << 20, help="skip files larger than this")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from glm5_lsp.context.engine import ContextEngine

    root = Path(args.path)
    if not root.exists():
        print(f"glm5-lsp index: {root} does not exist", file=sys.stderr)
        return 2
    engine = ContextEngine(root, cache_dir=args.cache_dir, max_file_bytes=args.max_file_bytes)
    started = time.perf_counter()
    with tqdm(desc="indexing", unit=" item", file=sys.stderr, dynamic_ncols=True) as bar:

        def progress(item: str) -> None:
            bar.set_postfix_str(Path(item).name[-40:], refresh=False)
            bar.update(1)

        stats, api = engine.index_workspace(progress, packages=not args.no_packages)
    seconds = time.perf_counter() - started
    languages = ", ".join(f"{n} {lang}" for lang, n in sorted(stats.languages.items())) or "none"
    print(f"workspace: {engine.root}")
    print(f"source files: {stats.files} ({languages}); parsed {stats.parsed}, "
          f"reused from cache {stats.from_cache}, skipped {stats.skipped}")
    print(f"symbols: {stats.symbols}")
    print(f"API docs: {api.chunks} chunks from {len(api.packages)} packages and {api.doc_files} workspace doc files"
          + (" (index rebuilt)" if api.rebuilt else " (index reused)"))
    if api.packages:
        print("  packages: " + ", ".join(api.packages))
    if api.skipped:
        print("  skipped (not found or no public API): " + ", ".join(api.skipped))
    print(f"cache: {engine.symbols.cache_dir}")
    print(f"done in {seconds:.1f} s")
    return 0
