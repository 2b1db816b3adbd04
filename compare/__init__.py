"""``swapplan compare``: every planner x budget x profile x machine, as rows, charts and a report."""
