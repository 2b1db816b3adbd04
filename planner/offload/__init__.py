"""Offload planners: work moved to the host CPU (ZeRO-Offload's and ZeRO-Infinity's
optimizer step), with the state it reads and writes."""
