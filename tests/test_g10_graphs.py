"""benchmarks/g10_graphs.py: G10's analysis dump (kernels.config) read as a profile."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from g10_graphs import read_kernels, to_profile  # noqa: E402

# Three kernels in G10's dump format: a forward kernel reading the input (tensor1, read
# before any write: there from the start) and a weight (tensor2, global), a backward one,
# and an apply-grad kernel that writes the weight (an in-place update). 1,200 cycles = 1 us.
DUMP = """Kernel ID: 0, Name: Conv2d_Forward
Parent OP ID:1; Name: Conv2d
Execution Time: 2400
Input Tensors:
tensor1 Is weight (global)?: 0, Size in byte: 4096, Range:0--4096
tensor2 Is weight (global)?: 1, Size in byte: 8192, Range:4096--12288
Output Tensors:
tensor3 Is weight (global)?: 0, Size in byte: 16384, Range:12288--28672
____________________________________________________________________
Kernel ID: 1, Name: Conv2d_Backward_Weight
Parent OP ID:1; Name: Conv2d
Execution Time: 1200
Input Tensors:
tensor3 Is weight (global)?: 0, Size in byte: 16384, Range:12288--28672
tensor1 Is weight (global)?: 0, Size in byte: 4096, Range:0--4096
Output Tensors:
tensor4 Is weight (global)?: 0, Size in byte: 8192, Range:28672--36864
____________________________________________________________________
Kernel ID: 2, Name: Conv2d_Apply_Grad
Parent OP ID:1; Name: Conv2d
Execution Time: 600
Input Tensors:
tensor4 Is weight (global)?: 0, Size in byte: 8192, Range:28672--36864
tensor2 Is weight (global)?: 1, Size in byte: 8192, Range:4096--12288
Output Tensors:
tensor2 Is weight (global)?: 1, Size in byte: 8192, Range:4096--12288
____________________________________________________________________
"""


def test_a_g10_dump_reads_as_a_profile(tmp_path):
    path = tmp_path / "kernels.config"
    path.write_text(DUMP)
    kernels = read_kernels(path)
    assert [(k["id"], k["name"], k["cycles"]) for k in kernels] == [
        (0, "Conv2d_Forward", 2400), (1, "Conv2d_Backward_Weight", 1200), (2, "Conv2d_Apply_Grad", 600)]
    profile = to_profile(kernels, "g10-tiny")
    ops = {op.id: op for op in profile.ops}
    assert [(op.id, op.phase, op.time_us) for op in profile.ops] == [
        ("k0", "forward", 2.0), ("k1", "backward", 1.0), ("k2", "optimizer", 0.5)]
    assert ops["k0"].inputs == ("tensor1", "tensor2") and ops["k0"].outputs == ("tensor3",)
    assert ops["k2"].updates == ("tensor2",) and ops["k2"].inputs == ("tensor4",)
    tensors = {t.id: t for t in profile.tensors}
    assert {t for t, tensor in tensors.items() if tensor.persistent} == {"tensor1", "tensor2"}
    kinds = (tensors["tensor1"].kind, tensors["tensor2"].kind, tensors["tensor3"].kind)
    assert kinds == ("input", "weight", "activation")
    assert tensors["tensor3"].bytes == 16384 and profile.ideal_us == 3.5
