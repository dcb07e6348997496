"""Which installed distributions may be trained on: a permissive licence read from their metadata.

Only the MIT, BSD, Apache, PSF and ISC families count as permissive here. The metadata is read in
order of precision: ``License-Expression`` (SPDX), then the ``License ::`` trove classifiers, then
the free-text ``License`` field. Anything unknown, copyleft (GPL, LGPL, MPL, ...) or outside those
families is refused: when in doubt, a file stays out of the corpus.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from email.message import Message

# SPDX identifier prefixes of the permissive families (compared case-insensitively).
_SPDX_PERMISSIVE: tuple[str, ...] = ("mit", "0bsd", "bsd", "apache", "psf", "python-", "cnri-python", "isc")
# Trove classifier suffixes (after "License :: OSI Approved :: ").
_CLASSIFIER_PERMISSIVE: tuple[str, ...] = (
    "MIT License",
    "MIT No Attribution License (MIT-0)",
    "BSD License",
    "Apache Software License",
    "Python Software Foundation License",
    "ISC License (ISCL)",
)
# Words in a free-text licence field, and phrases of full licence texts pasted into it.
_TEXT_PERMISSIVE = re.compile(
    r"\b(mit|bsd|apache|asl ?2|psf|python software foundation|isc)\b"
    r"|permission is hereby granted, free of charge"
    r"|redistribution and use in source and binary forms",
    re.IGNORECASE,
)
_TEXT_COPYLEFT = re.compile(r"\b(a?gpl|lgpl|mpl|eupl|cddl|epl|gnu|mozilla|copyleft)\b", re.IGNORECASE)


@dataclass(frozen=True)
class LicenceVerdict:
    """The licence a distribution declares (as written) and whether it is permissive."""

    licence: str
    permissive: bool


def classify_metadata(metadata: Message) -> LicenceVerdict:
    """Classify one distribution from its core metadata (``importlib.metadata.Distribution.metadata``)."""
    expression = (metadata.get("License-Expression") or "").strip()
    if expression:
        return LicenceVerdict(expression, spdx_is_permissive(expression))
    classifiers = [
        c.split("::")[-1].strip()
        for c in (metadata.get_all("Classifier") or [])
        if c.startswith("License ::")
    ]
    if classifiers:
        return LicenceVerdict("; ".join(classifiers), all(c in _CLASSIFIER_PERMISSIVE for c in classifiers))
    text = (metadata.get("License") or "").strip()
    return LicenceVerdict(_short(text) or "UNKNOWN", text_is_permissive(text))


def spdx_is_permissive(expression: str) -> bool:
    """An SPDX expression is permissive when some ``OR`` alternative has only permissive ``AND`` parts.

    Parentheses are flattened (enough for the expressions found in package metadata);
    ``WITH`` exceptions such as ``Apache-2.0 WITH LLVM-exception`` only add permissions.
    """
    flat = expression.replace("(", " ").replace(")", " ")
    for alternative in re.split(r"\s+OR\s+", flat, flags=re.IGNORECASE):
        parts = [p.strip() for p in re.split(r"\s+AND\s+", alternative, flags=re.IGNORECASE) if p.strip()]
        ids = [re.split(r"\s+WITH\s+", p, flags=re.IGNORECASE)[0].strip().lower() for p in parts]
        if ids and all(i.startswith(_SPDX_PERMISSIVE) for i in ids):
            return True
    return False


def text_is_permissive(text: str) -> bool:
    """A free-text licence field is permissive when it names a permissive family and no copyleft one."""
    return bool(text) and bool(_TEXT_PERMISSIVE.search(text)) and not _TEXT_COPYLEFT.search(text)


def _short(text: str, limit: int = 80) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
