"""Python names: what is visible, what exists, what a word may become.

- ``scope``: the names visible at the cursor, read from the text (no parse), per top-level piece;
- ``members``: a class's attributes as its methods' ``self.`` assignments define them;
- ``words``: finishing the typed word from the names in scope;
- ``jedi_names``: jedi's definitions and references for the context engine;
- ``jedi``: the package's one jedi entry (``environment``, ``warm_jedi``): one environment, one
  warm-up per module per process.
"""
