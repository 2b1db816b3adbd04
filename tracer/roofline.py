"""Kernel times from a roofline model of a hardware preset.

time = launch overhead + max(flops / (peak flops x compute efficiency),
                             bytes moved / (HBM bandwidth x memory efficiency))

The efficiencies are stated, not fitted: large GEMMs and convolutions reach about
70% of the tensor-core / FP32 peak in cuBLAS and cuDNN, and streaming kernels about
80% of the HBM datasheet bandwidth (STREAM-like copies); a kernel launch costs a few
microseconds of GPU time when the launch queue is full (about 4 us).
"""
from __future__ import annotations

from simulator.errors import InputError
from simulator.hardware import Hardware

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
COMPUTE_EFFICIENCY = 0.70
MEMORY_EFFICIENCY = 0.80
LAUNCH_US = 4.0


def peak_tflops(hardware: Hardware, dtype: str) -> float:
    """The datasheet peak for ``dtype`` (bf16 falls back to an error on GPUs without it)."""
    if dtype == "fp32":
        return hardware.gpu.fp32_tflops
    if dtype == "fp16":
        return hardware.gpu.fp16_tflops
    if dtype == "bf16":
        if hardware.gpu.bf16_tflops is None:
            raise InputError("<argument>", "dtype", f"{hardware.name} has no bf16 support")
        return hardware.gpu.bf16_tflops
    raise InputError("<argument>", "dtype", f"unknown dtype {dtype!r} (use fp32, fp16 or bf16)")


def kernel_time_us(hardware: Hardware, flops: float, bytes_moved: float, dtype: str = "fp32") -> float:
    """Roofline time of one kernel in microseconds, rounded to 1 ns for stable output."""
    compute_us = flops / (peak_tflops(hardware, dtype) * 1e12 * COMPUTE_EFFICIENCY) * 1e6
    memory_us = bytes_moved / (hardware.gpu.hbm_gbps * 1e9 * MEMORY_EFFICIENCY) * 1e6
    return round(LAUNCH_US + max(compute_us, memory_us), 3)
