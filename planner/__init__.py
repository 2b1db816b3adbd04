"""Planners: each decides what leaves GPU memory, where it goes, and when it returns."""
