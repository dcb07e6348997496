"""glm5-lsp: a self-hostable AI coding assistant speaking the Language Server Protocol.

The layers, top to bottom, are listed in ARCHITECTURE.md's ``layers`` block (tests/test_architecture.py
holds the imports to it): the front ends (server, batch, evaluate, generate, serve_model) reach
everything through ``glm5_lsp.pipeline`` and the ground floor.
"""

__version__ = "0.1.0"
