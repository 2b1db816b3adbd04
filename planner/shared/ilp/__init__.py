"""The interval MILP the ILP planners share (autotm and tmof, deeptm in planner/swap/; joint
in planner/swap_recompute/): its candidate intervals (candidates.py, with the release and
fetch positions of positions.py), its columns and rows (rows.py), a solution read back as
moves (decode.py), solved by HiGHS (planner/shared/highs.py); what the planners on it share
(common.py: limits, the heuristic start, LP-guided fixing, lowering a solution), refining
a plan at the positions it ran at (refine.py), and how the swap MILPs run (solve.py). No
planner is registered here."""
