"""glm5-lsp: a self-hostable AI coding assistant speaking the Language Server Protocol.

Layers (each imports only those below it; see ARCHITECTURE.md):

    cli
    server/   batch   evaluate/
    pipeline
    repair/
    context/   backends/   train/
    model/   spans   settings
"""

__version__ = "0.1.0"
