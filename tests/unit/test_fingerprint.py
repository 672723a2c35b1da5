"""fingerprint.py: a stable digest, explained differences, keys, and recorded GPU facts (no GPU needed)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest

from pytest_compilecache import fingerprint
from pytest_compilecache.fingerprint import DIGEST_LENGTH
from pytest_compilecache.fingerprint import Fingerprint

# Device facts as probe.device_facts() reported them on real machines.
H100: dict[str, Any] = {
    "cuda": "12.8",
    "hip": "",
    "triton": "3.4.0",
    "gpus": [{"name": "NVIDIA H100 80GB HBM3", "capability": "9.0"}],
}
A100: dict[str, Any] = {
    "cuda": "12.8",
    "hip": "",
    "triton": "3.4.0",
    "gpus": [{"name": "NVIDIA A100-SXM4-80GB", "capability": "8.0"}],
}
CPU_ONLY: dict[str, Any] = {"cuda": "", "hip": "", "triton": "", "gpus": []}

FACTS = {"torch": "2.13.0", "python": "cpython 3.11.7", "arch": "x86_64", "cuda": "12.8"}


def test_digest_is_stable_hex_of_fixed_length() -> None:
    digest = Fingerprint(FACTS).digest()
    assert re.fullmatch(rf"[0-9a-f]{{{DIGEST_LENGTH}}}", digest)
    # pinned: a change of the digest scheme orphans every stored bundle, so it must be deliberate
    assert digest == Fingerprint(dict(FACTS)).digest()
    canonical = '{"arch":"x86_64","cuda":"12.8","python":"cpython 3.11.7","torch":"2.13.0"}'
    assert digest == hashlib.sha256(canonical.encode()).hexdigest()[:DIGEST_LENGTH] == "a290e04456f320f4"


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
        "gpus": "NVIDIA H100 80GB HBM3 (9.0)",
    }
    assert fingerprint.device_facts(CPU_ONLY) == {"cuda": "none", "hip": "none", "triton": "none", "gpus": "none"}
    assert fingerprint.device_facts({}) == fingerprint.device_facts(CPU_ONLY)


def test_several_gpus_keep_their_order() -> None:
    two = {**H100, "gpus": H100["gpus"] + A100["gpus"]}
    assert fingerprint.device_facts(two)["gpus"] == "NVIDIA H100 80GB HBM3 (9.0); NVIDIA A100-SXM4-80GB (8.0)"


def test_rocm_architecture_is_a_fact() -> None:
    mi300 = {
        "cuda": "",
        "hip": "6.3.42131",
        "triton": "3.4.0",
        "gpus": [{"name": "AMD Instinct MI300X", "capability": "gfx942"}],
    }
    facts = fingerprint.device_facts(mi300)
    assert (facts["cuda"], facts["hip"], facts["gpus"]) == ("none", "6.3.42131", "AMD Instinct MI300X (gfx942)")


def test_h100_and_a100_have_different_digests() -> None:
    base = {"torch": "2.13.0", "python": "cpython 3.11.7"}
    h100 = Fingerprint({**base, **fingerprint.device_facts(H100)})
    a100 = Fingerprint({**base, **fingerprint.device_facts(A100)})
    assert h100.digest() != a100.digest()
    assert fingerprint.explain(a100.to_json(), h100.to_json()) == [
        "gpus: NVIDIA A100-SXM4-80GB (8.0) -> NVIDIA H100 80GB HBM3 (9.0)"
    ]


def test_platform_facts_describe_this_machine() -> None:
    facts = fingerprint.platform_facts()
    assert set(facts) == {"python", "python_abi", "python_prefix", "os", "arch", "libc", "cpu_model", "cpu_flags"}
    assert all(isinstance(v, str) and v for k, v in facts.items() if k != "python_abi")
    assert facts == fingerprint.platform_facts()


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
    assert facts["gpus"] == "NVIDIA H100 80GB HBM3 (9.0)"  # the recorded facts, not this CPU machine's
    assert facts["cuda"] == "12.8"
    assert facts["salt"] == "model-rev-7"
    assert facts["python"] == fingerprint.platform_facts()["python"]
    assert all(isinstance(v, str) for v in facts.values())
    assert h100.digest() != a100.digest()
    assert fingerprint.explain(a100.to_json(), h100.to_json()) == [
        "gpus: NVIDIA A100-SXM4-80GB (8.0) -> NVIDIA H100 80GB HBM3 (9.0)"
    ]


def test_collect_without_salt_has_no_salt_fact() -> None:
    assert "salt" not in fingerprint.collect(device=CPU_ONLY).facts
