"""The world model of swapplan: profiles, hardware, plans and their simulation.

This package is the base layer: it imports nothing from planner/, tracer/,
executor/ or cli.
"""
