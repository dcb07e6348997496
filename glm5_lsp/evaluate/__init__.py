"""``glm5-lsp eval``: HumanEval, HumanEval-infilling, HumanEvalFix and MBPP through the pipeline.

Candidates run in :mod:`glm5_lsp.evaluate.sandbox`, never in the CLI's own process.
"""
