"""Recorded GPUs: device-property objects shaped like torch's ``torch.cuda.get_device_properties`` results.

They go through ``probe.device_facts(Devices(...))``, the one seam through which tests give the plugin GPUs
this machine does not have; nothing here pretends a test ran on a GPU. The values are the parts' published
ones (name as torch reports it, compute capability, multiprocessor count). As on torch's CUDA builds,
``gcnArchName`` repeats the name ("HIP-only property; reuse name attribute for CUDA builds",
torch/cuda/_utils.py); on ROCm it is the GFX target, and ``major.minor`` is not what torch keys on.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field

from pytest_compilecache.probe import Devices


@dataclass(frozen=True)
class RecordedProperties:
    """The attributes of ``torch._C._CudaDeviceProperties`` the plugin may read."""

    name: str
    major: int
    minor: int
    multi_processor_count: int
    gcnArchName: str = field(default="")  # noqa: N815 (torch's spelling)

    @classmethod
    def cuda(cls, name: str, major: int, minor: int, sms: int) -> RecordedProperties:
        return cls(name, major, minor, sms, gcnArchName=name)


H100_SXM = RecordedProperties.cuda("NVIDIA H100 80GB HBM3", 9, 0, 132)
H100_PCIE = RecordedProperties.cuda("NVIDIA H100 PCIe", 9, 0, 114)
A100 = RecordedProperties.cuda("NVIDIA A100-SXM4-80GB", 8, 0, 108)
# A MIG slice reports its parent's name with fewer multiprocessors (1g.10gb: 14 of 108).
A100_MIG_1G = RecordedProperties.cuda("NVIDIA A100-SXM4-80GB", 8, 0, 14)
MI300X = RecordedProperties("AMD Instinct MI300X", 9, 4, 304, gcnArchName="gfx942:sramecc+:xnack-")

TRITON_KEY = "5f0c2d1e9a7b3c44"  # a short hash of triton_key(), as probe records it


def cuda_machine(*gpus: RecordedProperties, cuda: str = "12.8", triton: str = "3.4.0") -> Devices:
    """A CUDA build of torch on a machine with ``gpus`` visible, in CUDA_VISIBLE_DEVICES order."""
    return Devices(cuda, "", triton, TRITON_KEY if gpus else "", list(gpus))


def rocm_machine(*gpus: RecordedProperties) -> Devices:
    return Devices("", "6.3.42131", "3.3.0", TRITON_KEY if gpus else "", list(gpus))


CPU_ONLY = Devices("", "", "", "", [])
