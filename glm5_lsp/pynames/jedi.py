"""The package's one way into jedi: one environment for this interpreter, one warm-up per module.

Every jedi lookup in glm5_lsp goes through :func:`script` (a test keeps it so): the attributes the
decoding monitor allows after a dot, the fixer's module attributes, the exception types the
exception filler names, the server's document symbols and the context engine's definitions. One
environment means one set of inspected compiled modules and one cache of parsed modules, warmed
once (:func:`warm_jedi`) when a file opens in the server, or before each Python task in batch and eval.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

log = logging.getLogger(__name__)


def _jedi() -> Any:
    import jedi  # imported on first use: about 0.3 s

    return jedi


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


_WARMED: set[str] = set()  # modules warm_jedi has loaded in this process ("" for the builtins)


def warm_jedi(text: str, path: str | None = None, modules: int = 12) -> int:
    """Pay jedi's start-up before the first request does: Python's builtins, the modules ``text``
    imports (at most ``modules``) and the parse of ``text`` itself (kept per ``path``, so later
    lookups re-parse only what changed). The first of each costs 0.3-1 s, more than a request's
    provider time, and a lookup stopped at that time would never get to keep it. A module is loaded
    once per process: asking again would still cost about 0.4 s (jedi lists its names afresh).
    Returns the modules loaded by this call."""
    environment = in_process_environment()
    if "" not in _WARMED:
        _jedi().Script("''.", environment=environment).complete(1, 3)
        _WARMED.add("")
    names = list(dict.fromkeys(m.group(1) or m.group(2) for m in _IMPORTED.finditer(text)))
    loaded = 0
    for module in names[:modules]:
        if module.startswith(".") or module in _WARMED:
            continue
        try:
            _jedi().Script(f"import {module}\n{module}.", environment=environment).complete(2, len(module) + 1)
            loaded += 1
        except Exception:  # an odd module must not stop the rest
            log.debug("jedi could not load %s", module, exc_info=True)
        _WARMED.add(module)  # loaded, or not loadable: either way not worth asking again
    _jedi().Script(text, path=path, environment=environment).get_names()
    return loaded
