"""What a front end runs when a Python file opens, so the first requests on it fit their budgets."""

from __future__ import annotations

import logging

from glm5_lsp.pynames.jedi import warm_jedi
from glm5_lsp.quickfix import warm as warm_quick_fixes

log = logging.getLogger(__name__)


def warm(document: str, path: str | None = None, *, names: bool = True, fixes: bool = False) -> int:
    """Load what the decoding monitor's jedi lookups need for ``document`` (its imports' modules and
    its own parse: 0.3-1 s for a module's first load; ``names``) and what the model-free fixer reads
    (the import index, jedi's module attributes; ``fixes``). Returns the modules jedi loaded.
    Failures are logged, never raised: the requests then check a little less."""
    loaded = 0
    if names:
        try:
            loaded = warm_jedi(document, path)
        except Exception:
            log.warning("jedi could not read %s ahead of the requests", path or "the document", exc_info=True)
    if fixes:
        try:
            warm_quick_fixes(document, path)
        except Exception:
            log.warning("the fixer could not read %s ahead of the requests", path or "the document", exc_info=True)
    return loaded
