"""The baseline: ``none``, the no-swap plan every family is compared with."""
