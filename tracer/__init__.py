"""Turns models and traces into profiles: synthetic generators (no torch), and,
with the ``trace`` extra, PyTorch tracing and trace import."""
