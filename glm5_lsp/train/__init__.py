"""Training the embedded default model: corpus, tokenizer, FIM, packing, dense -> indexer warm-up ->
sparse training, evaluation and the model card. ``glm5-lsp train`` (``cli.py``) runs it all; the
modules import torch only where they train or evaluate, so the corpus and tokenizer steps stay light.
"""
