"""jedi's parsed-module cache (parso's pickles) shared with other processes: a torn file is a miss."""

from __future__ import annotations

import os
import pickle
import time

import jedi
import parso
import parso.cache

from glm5_lsp.pynames.jedi import script


def _torn_cache_entry(tmp_path, monkeypatch):
    """A module on disk and, in a cache folder of its own, the first bytes of a pickle of its parse,
    newer than the module: what a reader sees while another process is still writing it."""
    cache_dir = tmp_path / "jedi-cache"
    monkeypatch.setattr(jedi.settings, "cache_directory", str(cache_dir))
    module = tmp_path / "shapes.py"
    module.write_text("def area(width, height):\n    return width * height\n", encoding="utf-8")
    entry = parso.cache._get_hashed_path(parso.load_grammar()._hashed, module, cache_path=cache_dir)
    os.makedirs(os.path.dirname(entry), exist_ok=True)
    with open(entry, "wb") as handle:
        handle.write(pickle.dumps({"torn": "x" * 200}, pickle.HIGHEST_PROTOCOL)[:7])
    later = time.time() + 60
    os.utime(entry, (later, later))
    return module, entry


def _complete_an_import(tmp_path) -> list[str]:
    code = "import shapes\nshapes.ar"
    return [c.name for c in script(code, path=str(tmp_path / "main.py")).complete(2, 9)]


def test_jedi_reads_past_a_torn_parso_pickle(tmp_path, monkeypatch) -> None:
    _, entry = _torn_cache_entry(tmp_path, monkeypatch)
    assert _complete_an_import(tmp_path) == ["area"]  # parso's own reader raises EOFError here
    assert [p for p in os.listdir(os.path.dirname(entry)) if p.endswith(".tmp")] == []


def test_the_rewritten_pickle_is_whole(tmp_path, monkeypatch) -> None:
    _, entry = _torn_cache_entry(tmp_path, monkeypatch)
    os.utime(entry, (time.time(), 0))  # older than the module: parsed again, its entry rewritten by our writer
    assert _complete_an_import(tmp_path) == ["area"]
    with open(entry, "rb") as handle:
        item = pickle.load(handle)
    assert item.node.get_code().startswith("def area")


def test_a_failed_warm_up_of_jedi_does_not_stop_the_model_loading(tiny_checkpoint, monkeypatch, caplog) -> None:
    """The server's load warms jedi's builtins; when jedi fails there (as it did, reading a torn
    cache file, under a second server starting beside it), the model is still loaded."""
    import logging

    from glm5_lsp.pipeline import session as session_module
    from glm5_lsp.pipeline.core import PipelineSettings

    def torn(text, path=None):
        raise EOFError("Ran out of input")

    monkeypatch.setattr(session_module, "warm_jedi", torn)
    with caplog.at_level(logging.WARNING):
        opened = session_module.open_session("local", {"model_path": str(tiny_checkpoint)}, PipelineSettings(),
                                             warm_names=True)
    assert opened.pipeline is not None
    assert "jedi could not load Python's builtins" in caplog.text
