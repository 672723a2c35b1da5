"""fingerprint.py: a stable digest, explained differences, keys, and recorded GPU facts (no GPU needed)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_compilecache import ConfigError
from pytest_compilecache import fingerprint
from pytest_compilecache import probe
from pytest_compilecache.fingerprint import DIGEST_LENGTH
from pytest_compilecache.fingerprint import Fingerprint
from tests import devices

# Device facts as probe.device_facts() makes them from recorded device-property objects (tests/devices.py).
H100: dict[str, Any] = probe.device_facts(devices.cuda_machine(devices.H100_SXM))
A100: dict[str, Any] = probe.device_facts(devices.cuda_machine(devices.A100))
CPU_ONLY: dict[str, Any] = probe.device_facts(devices.CPU_ONLY)

FACTS = {"torch": "2.13.0", "python": "cpython 3.11.7", "arch": "x86_64", "cuda": "12.8"}


def test_digest_is_stable_hex_of_fixed_length() -> None:
    digest = Fingerprint(FACTS).digest()
    assert re.fullmatch(rf"[0-9a-f]{{{DIGEST_LENGTH}}}", digest)
    # pinned: a change of the digest scheme orphans every stored bundle, so it must be deliberate
    assert digest == Fingerprint(dict(FACTS)).digest()
    canonical = '{"arch":"x86_64","cuda":"12.8","python":"cpython 3.11.7","torch":"2.13.0"}'
    keyed = f"bundle format 3\n{canonical}"  # the format is keyed (test_a_bundle_format_bump_starts_new_lineages)
    assert digest == hashlib.sha256(keyed.encode()).hexdigest()[:DIGEST_LENGTH] == "6b8b753f543f20e5"


def test_a_bundle_format_bump_starts_new_lineages(monkeypatch: pytest.MonkeyPatch) -> None:
    """The format is in the digest, so in every key and lineage: after a bump, a restore's listing of its
    lineage holds no bundle of the old format (none is read and refused). Format 2, the last before the format
    was keyed, had the facts alone (the digests of the bundles stored then)."""
    from pytest_compilecache.manifest import FORMAT_VERSION
    from tests.fakes import MemoryStore

    assert FORMAT_VERSION == 3 and Fingerprint(FACTS).digest() == "6b8b753f543f20e5"  # a bump fails here first
    canonical = '{"arch":"x86_64","cuda":"12.8","python":"cpython 3.11.7","torch":"2.13.0"}'
    monkeypatch.setattr(fingerprint, "FORMAT_VERSION", 2)
    assert Fingerprint(FACTS).digest() == hashlib.sha256(canonical.encode()).hexdigest()[:DIGEST_LENGTH]
    assert Fingerprint(FACTS).digest() == "a290e04456f320f4"  # what format 2 keyed its bundles by
    old_key = fingerprint.make_key("cc", Fingerprint(FACTS).digest(), "run-1")
    store = MemoryStore()
    store.objects[old_key] = (b"a format 2 bundle", 1.0)
    monkeypatch.setattr(fingerprint, "FORMAT_VERSION", 3)
    bumped = Fingerprint(FACTS).digest()
    assert bumped == hashlib.sha256(f"bundle format 3\n{canonical}".encode()).hexdigest()[:DIGEST_LENGTH]
    lineage = fingerprint.restore_prefix("cc", bumped)
    assert not old_key.startswith(lineage) and store.list(lineage) == []
    assert fingerprint.make_key("cc", bumped, "run-2").startswith(lineage)


def test_digest_ignores_insertion_order() -> None:
    reordered = dict(reversed(list(FACTS.items())))
    assert list(reordered) != list(FACTS)
    assert Fingerprint(reordered).digest() == Fingerprint(FACTS).digest()


@pytest.mark.parametrize(
    "change",
    [{"torch": "2.13.1"}, {"salt": "v2"}, {"cuda": ""}, {"arch ": "x86_64"}],
)
def test_any_fact_changes_the_digest(change: dict[str, str]) -> None:
    assert Fingerprint({**FACTS, **change}).digest() != Fingerprint(FACTS).digest()


def test_digest_is_not_fooled_by_separators() -> None:
    # canonical JSON, not naive concatenation: moving text between key and value changes the digest
    assert Fingerprint({"a": "bc"}).digest() != Fingerprint({"ab": "c"}).digest()


def test_json_round_trip_is_sorted_and_stringly() -> None:
    fp = Fingerprint({"b": "2", "a": "1"})
    assert list(fp.to_json()) == ["a", "b"]
    again = Fingerprint.from_json({"b": 2, "a": 1})
    assert again.to_json() == fp.to_json()
    assert again.digest() == fp.digest()


def test_explain_lists_only_the_differing_facts_sorted() -> None:
    old = {"torch": "2.13.0", "python": "3.11", "gpus": "A", "gone": "x"}
    new = {"torch": "2.14.1", "python": "3.11", "gpus": "B", "salt": "v2"}
    assert fingerprint.explain(old, new) == [
        "gone: x -> (absent)",
        "gpus: A -> B",
        "salt: (absent) -> v2",
        "torch: 2.13.0 -> 2.14.1",
    ]
    assert fingerprint.explain(new, dict(new)) == []


def test_keys_are_built_broad_to_specific() -> None:
    key = fingerprint.make_key("compilecache-v1", "abcdef0123456789", "20260101T000000-42")
    assert key == "compilecache-v1-abcdef0123456789-20260101T000000-42"
    prefix = fingerprint.restore_prefix("compilecache-v1", "abcdef0123456789")
    assert prefix == "compilecache-v1-abcdef0123456789-"
    assert key.startswith(prefix)
    # a longer prefix does not capture another prefix's keys
    assert not fingerprint.make_key("compilecache-v1x", "abcdef0123456789", "1").startswith(prefix)


def test_default_suffix_is_a_valid_sortable_key_part() -> None:
    suffix = fingerprint.default_suffix()
    assert re.fullmatch(r"\d{8}T\d{6}-\d+", suffix)


def test_device_facts_flatten_recorded_gpus() -> None:
    assert fingerprint.device_facts(H100) == {
        "cuda": "12.8",
        "hip": "none",
        "triton": "3.4.0",
        "triton_key": devices.TRITON_KEY,
        "gpus": "NVIDIA H100 80GB HBM3 (9.0, 132 SMs)",
    }
    # No GPU: no triton key fact at all, so CPU-only fingerprints keep the digest they had.
    assert fingerprint.device_facts(CPU_ONLY) == {"cuda": "none", "hip": "none", "triton": "none", "gpus": "none"}
    assert fingerprint.device_facts({}) == fingerprint.device_facts(CPU_ONLY)


def test_the_cuda_capability_is_major_minor_not_the_name_torch_repeats_as_gcn_arch() -> None:
    # On CUDA builds torch's gcnArchName is the name again: the capability fact used to read it (issue 27.1).
    assert devices.H100_SXM.gcnArchName == devices.H100_SXM.name
    assert H100["gpus"] == [{"name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "sms": 132}]
    assert A100["gpus"][0]["capability"] == "8.0"


def test_identical_gpus_in_any_number_and_order_share_one_fingerprint() -> None:
    one = fingerprint.device_facts(probe.device_facts(devices.cuda_machine(devices.H100_SXM)))
    eight = fingerprint.device_facts(probe.device_facts(devices.cuda_machine(*[devices.H100_SXM] * 8)))
    assert one == eight  # a 1-GPU and an 8-GPU runner of one model share bundles (issue 27.2)
    mixed = devices.cuda_machine(devices.H100_SXM, devices.A100, devices.H100_SXM)
    reordered = devices.cuda_machine(devices.A100, devices.H100_SXM)
    assert fingerprint.device_facts(probe.device_facts(mixed)) == fingerprint.device_facts(
        probe.device_facts(reordered)
    )
    assert fingerprint.device_facts(probe.device_facts(mixed))["gpus"] == (
        "NVIDIA A100-SXM4-80GB (8.0, 108 SMs); NVIDIA H100 80GB HBM3 (9.0, 132 SMs)"
    )


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (devices.A100, devices.A100_MIG_1G),  # one name, a MIG slice's 14 SMs: kernels bake in the SM count
        (devices.H100_SXM, devices.H100_PCIE),  # one capability, another part
    ],
)
def test_parts_that_compile_differently_do_not_share(one: Any, other: Any) -> None:
    facts = [fingerprint.device_facts(probe.device_facts(devices.cuda_machine(gpu))) for gpu in (one, other)]
    assert facts[0]["gpus"] != facts[1]["gpus"]


def test_triton_content_hash_is_a_fact() -> None:
    # torch's FX key uses triton_key(), not the version: a rebuilt triton of one version must not share.
    rebuilt = devices.cuda_machine(devices.H100_SXM)._replace(triton_key="0123456789abcdef")
    changed = fingerprint.explain(fingerprint.device_facts(H100), fingerprint.device_facts(probe.device_facts(rebuilt)))
    assert changed == [f"triton_key: {devices.TRITON_KEY} -> 0123456789abcdef"]


def test_rocm_architecture_is_the_gcn_arch_name() -> None:
    facts = fingerprint.device_facts(probe.device_facts(devices.rocm_machine(devices.MI300X)))
    assert (facts["cuda"], facts["hip"]) == ("none", "6.3.42131")
    assert facts["gpus"] == "AMD Instinct MI300X (gfx942:sramecc+:xnack-, 304 SMs)"


def test_recorded_facts_without_sm_counts_still_read() -> None:
    # A --device-facts file written before the SM count was a fact.
    old = {"cuda": "12.8", "gpus": [{"name": "NVIDIA H100 80GB HBM3", "capability": "9.0"}]}
    assert fingerprint.device_facts(old)["gpus"] == "NVIDIA H100 80GB HBM3 (9.0)"
    with pytest.raises(ConfigError, match="sms"):
        fingerprint.device_facts({"gpus": [{"name": "x", "capability": "9.0", "sms": "132"}]})


def test_h100_and_a100_have_different_digests() -> None:
    base = {"torch": "2.13.0", "python": "cpython 3.11.7"}
    h100 = Fingerprint({**base, **fingerprint.device_facts(H100)})
    a100 = Fingerprint({**base, **fingerprint.device_facts(A100)})
    assert h100.digest() != a100.digest()
    assert fingerprint.explain(a100.to_json(), h100.to_json()) == [
        "gpus: NVIDIA A100-SXM4-80GB (8.0, 108 SMs) -> NVIDIA H100 80GB HBM3 (9.0, 132 SMs)"
    ]


def test_platform_facts_describe_this_machine() -> None:
    facts = fingerprint.platform_facts()
    assert set(facts) == {"python", "python_abi", "python_prefix", "os", "arch", "libc", "cpu_model", "cpu_flags"}
    assert all(isinstance(v, str) and v for k, v in facts.items() if k != "python_abi")
    assert facts == fingerprint.platform_facts()


# Two hosts of one CPU model, as /proc/cpuinfo would show them (a few of its flags): the second's kernel and
# hypervisor differ (mitigations, timers, virtualisation), not its instruction set.
HOST_A = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma bmi2 constant_tsc ssbd ibrs\n\n"
HOST_B = (
    "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: bmi2 fma avx2 avx sse2 fpu hypervisor tsc_known_freq "
    "md_clear amd_ssbd virt_ssbd tsc_adjust ht\n\n"
)


def test_the_cpu_fact_hashes_instruction_set_flags_only(tmp_path: Path) -> None:
    """Kernels are built with -march=native: the fact must change with the instructions the CPU runs, and with
    nothing else, or identical runners get lineages of their own (misses)."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    a.write_text(HOST_A)
    b.write_text(HOST_B)
    c.write_text(HOST_B.replace(" avx2 ", " avx2 avx512f "))  # one instruction-set extension more
    assert fingerprint._cpu(str(a)) == fingerprint._cpu(str(b)) == ("AMD EPYC", "avx avx2 bmi2 fma fpu sse2")
    assert fingerprint._cpu(str(c))[1] == "avx avx2 avx512f bmi2 fma fpu sse2"
    assert fingerprint.isa_flags("sse2 amd_ibpb hwp_epp v_spec_ctrl ibrs_enhanced arch_lbr avx512_vnni") == (
        "avx512_vnni sse2"
    )
    # What gcc's -march=native reads from CPUID (gcc/common/config/i386/cpuinfo.h), as Linux names it: none is
    # ever left out of the hash.
    isa = (
        "mmx sse sse2 pni ssse3 sse4_1 sse4_2 sse4a avx avx2 fma fma4 xop f16c bmi1 bmi2 adx abm lzcnt popcnt movbe "
        "aes pclmulqdq vaes vpclmulqdq gfni sha_ni rdrand rdseed xsave xsaveopt xsavec xsaves clflushopt clwb "
        "clzero fsgsbase rdpid rdtscp pku ospke user_shstk shstk ibt cx16 cx8 lahf_lm prefetchw 3dnowprefetch "
        "movdiri movdir64b enqcmd serialize tsxldtrk waitpkg cldemote wbnoinvd ptwrite avx512f avx512dq avx512cd "
        "avx512bw avx512vl avx512ifma avx512vbmi avx512_vbmi2 avx512_vnni avx512_bitalg avx512_vpopcntdq "
        "avx512_bf16 avx512_fp16 avx512_vp2intersect avx_vnni avx_vnni_int8 avx_ifma avx_ne_convert amx_tile "
        "amx_int8 amx_bf16 amx_fp16 amx_complex rtm hle sgx kl widekl hreset uintr cmpccxadd prefetchi tbm"
    )
    assert fingerprint.isa_flags(isa) == " ".join(sorted(isa.split()))
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd sve\nCPU part\t: 0xd40\n\n")
    assert fingerprint._cpu(str(arm))[1] == "asimd fp sve"  # arm's Features name instruction sets only


@pytest.fixture(scope="module")
def collected() -> tuple[Fingerprint, Fingerprint]:
    """The real collection (imports torch through probe) with recorded device facts, H100 and A100."""
    return fingerprint.collect(salt="model-rev-7", device=H100), fingerprint.collect(salt="model-rev-7", device=A100)


def test_collect_with_recorded_device_facts(collected: tuple[Fingerprint, Fingerprint]) -> None:
    import torch

    h100, a100 = collected
    facts = h100.facts
    assert facts["torch"] == torch.__version__
    assert {"torch_git", "torch_path", "cpu_capability", "threads", "cxx", "torch_tree"} <= set(facts)
    assert facts["gpus"] == "NVIDIA H100 80GB HBM3 (9.0, 132 SMs)"  # the recorded facts, not this CPU machine's
    assert facts["cuda"] == "12.8"
    assert facts["salt"] == "model-rev-7"
    assert facts["python"] == fingerprint.platform_facts()["python"]
    assert all(isinstance(v, str) for v in facts.values())
    assert h100.digest() != a100.digest()
    assert fingerprint.explain(a100.to_json(), h100.to_json()) == [
        "gpus: NVIDIA A100-SXM4-80GB (8.0, 108 SMs) -> NVIDIA H100 80GB HBM3 (9.0, 132 SMs)"
    ]


def test_collect_without_salt_has_no_salt_fact() -> None:
    assert "salt" not in fingerprint.collect(device=CPU_ONLY).facts


# --------------------------------------------------------------------------- one fingerprint per job (issue 27.4)


@pytest.fixture
def threads() -> Any:
    import torch

    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def test_a_handed_over_fingerprint_is_the_one_a_later_step_uses(threads: Any) -> None:
    threads(1)
    plan = fingerprint.collect(salt="v2", device=H100)  # the Action's plan step
    env = fingerprint.handover(plan)
    assert list(env) == [fingerprint.HANDOVER_ENV]
    threads(2)  # pytest runs with another OMP_NUM_THREADS
    assert fingerprint.collect(salt="v2", device=H100).digest() != plan.digest()  # computing again disagrees
    assert fingerprint.collect(salt="v2", environ=env) == plan


@pytest.mark.parametrize(
    "change",
    [{"python_prefix": "/elsewhere/venv"}, {"torch_path": "/elsewhere/torch"}, {"salt": "v3"}, {"cpu_flags": "x"}],
)
def test_a_fingerprint_of_another_install_is_not_reused(change: dict[str, str]) -> None:
    here = fingerprint.collect(salt="v2", environ={})
    other = Fingerprint({**here.facts, **change, "gpus": "NVIDIA H100 80GB HBM3 (9.0, 132 SMs)"})
    again = fingerprint.collect(salt="v2", environ=fingerprint.handover(other))
    assert again == here  # this process's own facts


@pytest.mark.parametrize("text", ["", "{", "[]", '{"python": 3}'])
def test_a_malformed_handover_is_ignored(text: str) -> None:
    assert fingerprint.handed_over({fingerprint.HANDOVER_ENV: text}, fingerprint.platform_facts()) is None


PLAN_THEN_PYTEST = """
import json, os, sys
from pytest_compilecache import ConfigError
from pytest_compilecache import fingerprint
fp = fingerprint.collect(salt="v2")
print(json.dumps({"digest": fp.digest(), "env": fingerprint.handover(fp)}))
"""


@pytest.mark.slow
def test_plan_step_and_pytest_agree_under_other_visible_devices_and_threads() -> None:
    """Two processes as the Action's plan step and pytest run them, with the variables that differ between
    steps of one job; the second reuses what the first handed over (the real collection both times)."""
    import json
    import os
    import subprocess
    import sys

    from tests import torchenv

    def step(extra: dict[str, str]) -> dict[str, Any]:
        env = {**torchenv.inner_env(), **extra}
        out = subprocess.run(
            [sys.executable, "-c", PLAN_THEN_PYTEST], env=env, capture_output=True, text=True, timeout=300, check=True
        )
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        return result

    plan = step({"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
    alone = step({"OMP_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": "0"})
    assert alone["digest"] != plan["digest"]  # each computing its own: bundles saved where no restore looks
    handed = step({"OMP_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": "0", **plan["env"]})
    assert handed["digest"] == plan["digest"]
    assert os.environ.get(fingerprint.HANDOVER_ENV) is None
