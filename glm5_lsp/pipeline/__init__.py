"""The one seam between the front ends and everything below them.

The language server, ``batch``, ``eval``, ``generate`` and ``serve-model`` import from here and from
the ground floor only (a test reads the layer list in ARCHITECTURE.md and holds them to it):

- :class:`Pipeline` (``core``): ``complete``, ``generate``, ``fix``, ``fixes`` — context -> backend
  -> post-processing -> checks -> repair for one request;
- :func:`diagnose`, :func:`check_edit` (``checks.edits``): a document's own diagnostics, and an edit
  judged before it is offered, on the same checkers the pipeline judges candidates with;
- :func:`warm`: what a front end runs when a file opens (jedi's modules, the fixer's names);
- :func:`wants_multiline`, :func:`empty_bodies` (``context.syntax``): the one multi-line policy;
- ``session``: the backend, context engine and pipeline opened once (``open_session``), and the
  backend factory for the command line's ``--backend``.
"""

from __future__ import annotations

from glm5_lsp.backends.base import BackendError, BackendUnavailable
from glm5_lsp.checks.edits import PERF_SOURCE, Verdict, check_edit, diagnose
from glm5_lsp.context.syntax import EmptyBody, empty_bodies, forget_trees, wants_multiline
from glm5_lsp.pipeline.core import (
    MODEL_FIX_TITLE,
    PYTHON_BODY_STOPS,
    UNHURRIED_LOOKUP_S,
    Fix,
    FixRegion,
    Pipeline,
    PipelineResult,
    PipelineSettings,
    fix_region,
    idle_result,
    keeps_enough,
    working_lines,
)
from glm5_lsp.pipeline.warm import warm
from glm5_lsp.repair.loop import RepairSettings

__all__ = [
    "MODEL_FIX_TITLE",
    "PERF_SOURCE",
    "PYTHON_BODY_STOPS",
    "UNHURRIED_LOOKUP_S",
    "BackendError",
    "BackendUnavailable",
    "EmptyBody",
    "Fix",
    "FixRegion",
    "Pipeline",
    "PipelineResult",
    "PipelineSettings",
    "RepairSettings",
    "Verdict",
    "check_edit",
    "diagnose",
    "empty_bodies",
    "fix_region",
    "forget_trees",
    "idle_result",
    "keeps_enough",
    "wants_multiline",
    "warm",
    "working_lines",
]
