"""Placement planners: a swap plan with the GPU's one arena placed offline, an offset per
allocation, so that nothing fragments (R50): vdnn++."""
