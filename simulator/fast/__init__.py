"""The C twins of the simulator and their packing: ``explicit`` (simulator/fast/_fastsim.c:
the explicit-mode compile and run) and ``uvm`` (simulator/fast/_fastuvm.c: UVM mode's
run). Both must agree with the Python reference (simulator/run/) exactly; only
simulator/api.py chooses between them and the reference."""
