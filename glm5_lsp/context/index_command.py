"""``glm5-lsp index [PATH]``: build the symbol summaries, the API-doc index and the workspace
memory ahead of time.

Shows a progress bar while it reads files and packages, then prints what it indexed. Everything is
cached (``--cache-dir``, else ``$GLM5_LSP_CACHE_DIR``, else the user cache directory), so the
language server starts warm on this workspace: the memory's libraries (the standard library and the
distributions the workspace imports, in the model's tokens, with their suffix arrays) are what takes
minutes to build and is shared by every workspace; the workspace's own files are re-read when the
server starts (seconds).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", nargs="?", default=".", help="workspace folder (default: the current folder)")
    parser.add_argument("--cache-dir", default=None, help="where to keep the cache (default: user cache dir)")
    parser.add_argument("--no-packages", action="store_true",
                        help="skip the installed packages (their API docs, and the memory's libraries)")
    parser.add_argument("--no-memory", action="store_true", help="skip the workspace memory")
    parser.add_argument("--model", default=None,
                        help="the model whose tokens the memory holds (default: the embedded model)")
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
    if not args.no_memory:
        memory = build_memory(root, args)
        print(f"memory: {memory.files} files, {memory.tokens:,} tokens; libraries: "
              f"{', '.join(memory.libraries) or 'none'} ({memory.library_tokens:,} tokens, "
              f"{'from the cache' if memory.library_cached else 'built and cached'}); "
              f"{memory.bytes / 1e6:.0f} MB, {memory.build_seconds + memory.library_seconds:.1f} s")
    print(f"done in {time.perf_counter() - started:.1f} s")
    return 0


def build_memory(root: Path, args: argparse.Namespace):  # -> MemoryStats
    """The workspace memory of ``root`` built as the server builds it, its libraries cached."""
    from tqdm import tqdm

    from glm5_lsp.memory import MemorySettings, WorkspaceMemory
    from glm5_lsp.model import default_model_path, load_tokenizer

    tokenizer = load_tokenizer(args.model or default_model_path())
    settings = MemorySettings(libraries=not args.no_packages, stdlib=not args.no_packages)
    memory = WorkspaceMemory(tokenizer, settings, cache_dir=Path(args.cache_dir) if args.cache_dir else None)
    with tqdm(desc="memory", total=100, unit="%", file=sys.stderr, dynamic_ncols=True) as bar:

        def progress(message: str, fraction: float) -> None:
            bar.set_postfix_str(message[-40:], refresh=False)
            bar.update(max(0, round(100 * fraction) - bar.n))

        return memory.index_folder(root, progress=progress)
