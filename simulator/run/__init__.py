"""The rules in time: ``iteration.run_program`` runs a compiled program on the explicit
run's loop (``engine``) or UVM mode's (``uvm``, with ``uvm_memory``), over the resource
parts of ``resources`` (streams, links, GPU memory, tiers) or ``arena`` (GPU memory as
address ranges)."""
