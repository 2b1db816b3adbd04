"""Hardware presets and user hardware files."""
import pytest
import yaml

from simulator.errors import InputError
from simulator.hardware import hardware_from_dict, load_hardware, load_presets, preset_dir, preset_names

PRESETS = ["a100-40gb-128gb-g10", "a100-40gb-32gb-pcie4", "a100-40gb-pcie4", "a100-80gb-pcie4", "a100-80gb-sxm-x8",
           "h100-80gb-pcie5", "h100-80gb-sxm-x8", "h100-80gb-sxm-x8-2node", "h200-141gb-1.5tb-pcie5",
           "rtx4090-24gb-256gb-pcie4", "rtx4090-24gb-pcie4", "rtx4090-24gb-pcie4-x4", "v100-16gb-pcie3",
           "v100-32gb-pcie3"]
# the host link's PCIe generation of the multi-GPU boards, whose names say their GPU link instead
HOST_LINK = {"a100-80gb-sxm-x8": "pcie4", "h100-80gb-sxm-x8": "pcie5", "h100-80gb-sxm-x8-2node": "pcie5",
             "rtx4090-24gb-pcie4-x4": "pcie4"}


def test_all_presets_ship_and_load():
    assert preset_names() == PRESETS
    for hw in load_presets():
        assert hw.gpu.memory_bytes > 0 and hw.ssd is not None
        if hw.name == "a100-40gb-128gb-g10":   # G10's simulated machine: PCIe 3.0 x16's line rate, as G10 takes it
            assert (hw.pcie.h2d_gbps, hw.host.memory_bytes, hw.ssd.read_gbps) == (15.754, 128 * 2**30, 3.2)
            continue
        # effective PCIe bandwidth is below the theoretical x16 figure of its generation
        generation = HOST_LINK.get(hw.name, hw.name.rsplit("-", 1)[1])
        theoretical = {"pcie3": 15.75, "pcie4": 31.5, "pcie5": 63.0}[generation]
        assert hw.pcie.h2d_gbps < theoretical and hw.pcie.d2h_gbps < theoretical


def test_a_gpu_name_finds_its_plain_preset():
    # several presets share the A100 40 GB (with 32 GiB of host memory, G10's machine): a trace's
    # device name finds the plain one
    from simulator.catalog import preset_for_device
    assert preset_for_device("NVIDIA A100-PCIE-40GB") == "a100-40gb-pcie4"
    assert preset_for_device("NVIDIA GeForce RTX 4090") == "rtx4090-24gb-pcie4"


def test_preset_figures_match_datasheets():
    a100 = load_hardware("a100-40gb-pcie4")
    assert a100.gpu.memory_bytes == 40 * 2**30
    assert (a100.gpu.fp32_tflops, a100.gpu.fp16_tflops, a100.gpu.hbm_gbps) == (19.5, 312, 1555)
    assert load_hardware("v100-16gb-pcie3").gpu.bf16_tflops is None  # Volta has no bf16
    assert load_hardware("h100-80gb-pcie5").gpu.fp16_tflops == 756  # dense, not sparse
    # the anchors' setups: MegaTrain's H200 with 1.5 TB host memory, LoHan's 4090 with 256 GB
    h200, lohan = load_hardware("h200-141gb-1.5tb-pcie5"), load_hardware("rtx4090-24gb-256gb-pcie4")
    assert (h200.gpu.memory_bytes, h200.host.memory_bytes, h200.gpu.bf16_tflops) == (141 * 10**9, 1.5e12, 989)
    assert (lohan.gpu.memory_bytes, lohan.host.memory_bytes) == (24 * 2**30, 256 * 10**9)


def test_multi_gpu_presets_have_an_interconnect():
    # R57: ring bandwidth below the link's datasheet figure each way (NVLink 3: 300 GB/s, NVLink 4:
    # 450 GB/s, ConnectX-7: 50 GB/s); the 4090s have no GPU link and share PCIe
    a100, h100 = load_hardware("a100-80gb-sxm-x8").interconnect, load_hardware("h100-80gb-sxm-x8").interconnect
    two, rtx = load_hardware("h100-80gb-sxm-x8-2node").interconnect, load_hardware("rtx4090-24gb-pcie4-x4").interconnect
    assert (a100.kind, a100.world, a100.shares_pcie) == ("nvlink", 8, False) and a100.gbps < 300
    assert h100.world == 8 and h100.gbps < 450
    assert two.world == 16 and two.inter_node_gbps < 50 and two.ring(16) == (two.inter_node_gbps, 10)
    assert two.ring(8) == (two.gbps, two.latency_us)
    assert (rtx.kind, rtx.world, rtx.shares_pcie) == ("pcie", 4, True)
    assert all(load_hardware(n).interconnect is None for n in PRESETS if n not in HOST_LINK)


@pytest.mark.parametrize("section, field", [
    ({"kind": "infiniband", "gpus": 8, "gbps": 1}, "interconnect.kind"),
    ({"kind": "nvlink", "gpus": 0, "gbps": 1}, "interconnect.gpus"),
    ({"kind": "nvlink", "gpus": 8, "gbps": 0}, "interconnect.gbps"),
    ({"kind": "nvlink", "gpus": 8, "gbps": 1, "nodes": 2}, "interconnect.inter_node_gbps"),
    ({"kind": "nvlink", "gpus": 8, "gbps": 1, "inter_node_gbps": 5}, "interconnect.inter_node_gbps"),
    ({"kind": "nvlink", "gpus": 8, "gbps": 1, "speed": 5}, "interconnect"),
])
def test_bad_interconnect_names_the_field(section, field):
    data = load_hardware("a100-40gb-pcie4").to_dict()
    data["gpu"]["memory"] = data["gpu"].pop("memory_bytes")
    data["host"]["memory"] = data["host"].pop("memory_bytes")
    data["ssd"]["capacity"] = data["ssd"].pop("capacity_bytes")
    data["interconnect"] = section
    with pytest.raises(InputError, match=field.replace(".", r"\.")):
        hardware_from_dict(data, "box.yaml")


def test_every_preset_cites_sources():
    for name in PRESETS:
        text = (preset_dir() / f"{name}.yaml").read_text()
        assert "# Sources:" in text
        assert "datasheet" in text.lower() or "whitepaper" in text.lower()


def test_user_file_accepted_and_round_trips(tmp_path):
    data = load_hardware("a100-40gb-pcie4").to_dict()
    data["name"] = "my-box"
    data["pcie"]["duplex"] = "half"
    data["ssd"]["path"] = "direct"
    data["gpu"]["memory"] = data["gpu"].pop("memory_bytes")
    data["host"]["memory"] = data["host"].pop("memory_bytes")
    data["ssd"]["capacity"] = data["ssd"].pop("capacity_bytes")
    path = tmp_path / "box.yaml"
    path.write_text(yaml.safe_dump(data))
    hw = load_hardware(str(path))
    assert hw.name == "my-box" and hw.pcie.duplex == "half" and hw.ssd.path == "direct"
    assert hw.to_dict()["gpu"] == load_hardware("a100-40gb-pcie4").to_dict()["gpu"]


def test_ssd_optional():
    hw = hardware_from_dict({"name": "x", "gpu": {"memory": "8GiB", "fp32_tflops": 1, "fp16_tflops": 2, "hbm_gbps": 100},
                             "pcie": {"h2d_gbps": 10, "d2h_gbps": 10}, "host": {"memory": "64GiB"}})
    assert hw.ssd is None and hw.pcie.duplex == "full"


def test_unknown_preset_lists_presets():
    with pytest.raises(InputError, match="unknown preset 'a200'.*a100-40gb-pcie4"):
        load_hardware("a200")


@pytest.mark.parametrize("patch, where, problem", [
    (lambda d: d["gpu"].update(memory="lots"), "gpu.memory", "cannot read"),
    (lambda d: d["pcie"].update(h2d_gbps=0), "pcie.h2d_gbps", "must be > 0"),
    (lambda d: d["pcie"].update(duplex="triple"), "pcie.duplex", "not one of full, half"),
    (lambda d: d["ssd"].update(path="nfs"), "ssd.path", "not one of host, direct"),
    (lambda d: d["gpu"].pop("hbm_gbps"), "gpu.hbm_gbps", "missing required field"),
    (lambda d: d["gpu"].update(tf32_tflops=1), "gpu.tf32_tflops", "unknown field"),
    (lambda d: d.update(pcie=[1]), "pcie", "expected an object"),
])
def test_bad_hardware_file(tmp_path, patch, where, problem):
    data = yaml.safe_load((preset_dir() / "a100-40gb-pcie4.yaml").read_text())
    patch(data)
    path = tmp_path / "hw.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError) as info:
        load_hardware(str(path))
    assert str(info.value).startswith(f"{path}: {where}: ") and problem in str(info.value)
