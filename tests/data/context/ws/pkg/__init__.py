"""A tiny package used as a fixture workspace for the context engine tests."""
