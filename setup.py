"""The one compiled part: the native decoding step (``glm5_lsp/model/native.c``).

Everything else is in pyproject.toml. The extension is optional: where no C compiler is found the
install goes on without it and the generator runs the TorchScript path (``glm5_lsp/model/native.py``).
"""

import sys

from setuptools import Extension, setup

flags = ["/O2"] if sys.platform == "win32" else ["-O3", "-std=c99"]

setup(ext_modules=[Extension("glm5_lsp.model._native", ["glm5_lsp/model/native.c"], extra_compile_args=flags,
                             optional=True)])
