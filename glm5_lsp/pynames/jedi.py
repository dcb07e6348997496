"""The package's one way into jedi: one environment for this interpreter, one warm-up per module.

Every jedi lookup in glm5_lsp goes through :func:`script` (a test keeps it so): the attributes the
decoding monitor allows after a dot, the fixer's module attributes, the exception types the
exception filler names, the server's document symbols and the context engine's definitions. One
environment means one set of inspected compiled modules and one cache of parsed modules, warmed
once (:func:`warm_jedi`) when a file opens in the server, or before each Python task in batch and eval.

jedi is not thread-safe, and the server asks it from several threads (the model worker's decoding
monitor, the editor's list completions and code actions, a file's warm-up when it opens): each lookup,
with whatever it reads of jedi's answers, runs inside :func:`exclusive`. Three threads asking for
completions after ``os.`` and the like at once failed 1 to 5 times in 36 (``ValueError`` from deep in
parso's tree), and the monitor, reading a failure as "nothing to check", let any name through.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import pickle
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from glm5_lsp.disk_cache import write_atomically

log = logging.getLogger(__name__)
T = TypeVar("T")

_ONE_AT_A_TIME = threading.RLock()
_POLL_S = 0.005


@contextlib.contextmanager
def exclusive() -> Iterator[None]:
    """jedi to this thread alone while the block runs (re-entrant). The wait polls, so a lookup under
    :func:`~glm5_lsp.deadline.call_with_timeout` is still stopped on time while another thread's
    lookup runs (a plain blocking acquire would hold the stop off until it ends)."""
    while not _ONE_AT_A_TIME.acquire(timeout=_POLL_S):
        pass
    try:
        yield
    finally:
        _ONE_AT_A_TIME.release()


def one_at_a_time(function: Callable[..., T]) -> Callable[..., T]:
    """``function`` run inside :func:`exclusive` (for one that asks jedi and reads its answers)."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> T:
        with exclusive():
            return function(*args, **kwargs)

    return run


def _jedi() -> Any:
    import jedi  # imported on first use: about 0.3 s

    _guard_parso_cache()
    return jedi


@functools.cache
def _guard_parso_cache() -> bool:
    """Make parso's disk cache (jedi's parsed modules, pickles under ``~/.cache/parso``) safe to
    share between processes. parso writes a module's pickle in place and reads it unguarded, so a
    second process reading while the first writes (two editor windows, or jedi-language-server or
    pylsp beside us, on a cold cache) gets ``EOFError: Ran out of input`` out of jedi. Here a torn
    or unreadable pickle is a cache miss (parso parses the file again and rewrites it), and this
    process writes each pickle to a temporary file renamed into place. Returns whether the guard is
    in (False where parso's cache no longer has the functions it wraps)."""
    try:
        from parso import cache
    except ImportError:
        return False
    load = getattr(cache, "_load_from_file_system", None)
    hashed_path = getattr(cache, "_get_hashed_path", None)
    if load is None or hashed_path is None or not hasattr(cache, "_save_to_file_system"):
        log.debug("parso's cache has changed; its pickles are read and written unguarded")
        return False

    def guarded_load(hashed_grammar: str, path: Any, p_time: float, cache_path: Any = None) -> Any:
        try:
            return load(hashed_grammar, path, p_time, cache_path=cache_path)
        except Exception as error:  # noqa: BLE001 - torn, truncated or foreign: parse afresh
            log.debug("parso's cached parse of %s is unreadable (%s: %s); parsing it again",
                      path, type(error).__name__, error)
            return None

    def atomic_save(hashed_grammar: str, path: Any, item: Any, cache_path: Any = None) -> None:
        write_atomically(hashed_path(hashed_grammar, path, cache_path=cache_path),
                         pickle.dumps(item, pickle.HIGHEST_PROTOCOL))

    cache._load_from_file_system = guarded_load
    cache._save_to_file_system = atomic_save
    return True


def script(code: str, path: str | None = None, project: Any = None) -> Any:
    """``jedi.Script`` for ``code`` in the shared in-process environment (``project``: a
    ``jedi.Project`` for the workspace's own modules, or None)."""
    if project is not None:
        return _jedi().Script(code=code, path=path, project=project, environment=in_process_environment())
    return _jedi().Script(code=code, path=path, environment=in_process_environment())


def project(root: str) -> Any:
    """A ``jedi.Project`` rooted at ``root`` (the workspace folder)."""
    return _jedi().Project(root)


@functools.cache
def in_process_environment() -> object:
    """jedi's environment for this interpreter (one, shared): compiled modules are inspected here,
    with no helper process. Faster than the default (no round trips), and a lookup stopped midway
    (:func:`~glm5_lsp.deadline.call_with_timeout`) cannot leave a pipe to that process half read."""
    from jedi.api.environment import InterpreterEnvironment

    return InterpreterEnvironment()


_IMPORTED = re.compile(r"^[ \t]*(?:from[ \t]+([A-Za-z_][\w.]*)[ \t]+import|import[ \t]+([A-Za-z_][\w.]*))", re.MULTILINE)


_WARMED: set[str] = set()  # what warm_jedi has read in this process ("" for the builtins)
_MEMBERS: dict[str, frozenset[str] | None] = {}  # module -> the names jedi lists after it (None: it could not)


def module_members(module: str) -> frozenset[str] | None:
    """The names jedi completes after ``module.`` (``import module`` then ``module.``), listed once per
    process and kept: 0.1-2 s the first time a module is read, and asking jedi again costs tens of
    milliseconds to most of that again (it lists the names afresh). None where jedi cannot list it
    (also kept). The decoding monitor's module receivers, the fixer's module attributes and the
    warm-up when a file opens share the listing. Run it under a time limit where time matters
    (``deadline.call_with_timeout``): a listing stopped midway is not kept."""
    if module in _MEMBERS:
        return _MEMBERS[module]
    if not re.fullmatch(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", module):
        return None
    try:
        with exclusive():
            completions = _jedi().Script(f"import {module}\n{module}.", environment=in_process_environment()) \
                .complete(2, len(module) + 1)
            listed: frozenset[str] | None = frozenset(c.name for c in completions)
    except Exception:  # jedi fails in many ways on odd modules; such a module is not listed
        log.debug("jedi could not list %s", module, exc_info=True)
        listed = None
    _MEMBERS[module] = listed
    return listed


def members_known(module: str) -> bool:
    """Whether :func:`module_members` has ``module``'s answer at hand (no jedi call)."""
    return module in _MEMBERS


def warm_jedi(text: str, path: str | None = None, modules: int = 12) -> int:
    """Pay jedi's start-up before the first request does: Python's builtins, the modules ``text``
    imports (at most ``modules``; their names listed and kept, :func:`module_members`) and the parse
    of ``text`` itself (kept per ``path``, so later lookups re-parse only what changed). The first of
    each costs 0.3-1 s, more than a request's provider time, and a lookup stopped at that time would
    never get to keep it. Returns the modules listed by this call."""
    environment = in_process_environment()
    if "" not in _WARMED:
        with exclusive():
            _jedi().Script("''.", environment=environment).complete(1, 3)
        _WARMED.add("")
    names = list(dict.fromkeys(m.group(1) or m.group(2) for m in _IMPORTED.finditer(text)))
    loaded = 0
    for module in names[:modules]:
        if module.startswith(".") or members_known(module):
            continue
        module_members(module)  # listed, or not listable: either way kept, not asked again
        loaded += 1
    with exclusive():
        _jedi().Script(text, path=path, environment=environment).get_names()
    return loaded
