"""The one compiled part, ``glm5_lsp/native.c``: the model's decoding step in C (``model/native.py``)
and the workspace memory's suffix-array searches (``memory/index.py``).

Everything else is in pyproject.toml. The extension is optional: where no C compiler is found the
install goes on without it, the generator runs the TorchScript step and the memory searches in numpy.
"""

import sys

from setuptools import Extension, setup

flags = ["/O2"] if sys.platform == "win32" else ["-O3", "-std=c99", "-ffp-contract=fast"]

setup(ext_modules=[Extension("glm5_lsp._native", ["glm5_lsp/native.c"], extra_compile_args=flags, optional=True)])
