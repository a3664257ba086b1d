"""The reproduction's models and sizes, in one place: the role → model table, and each plan's per-role T and N.

A role is what a model stands for in the claims (the standard RoPE model, the sliding-window one, the one
trained with a large base, the one whose BOS C5 replaces); the claims name roles, never models, so that
changing a model here changes it everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from posleak.device import Placement

SAMPLES = ("A", "B")
SHOWN = "A"  # the sample whose figures, tables and numbers the report's text shows
RoleName = Literal["standard", "large-base", "sliding", "bos"]


@dataclass(frozen=True)
class Role:
    """One model of the reproduction: `folder` names its baseline run folder under OUT/runs/ (before the sample),
    `key` its entry in the manifest's runs, `label` how the claims' evidence names it."""

    model: str
    folder: str
    key: str
    label: str


ROLES: dict[RoleName, Role] = {
    # standard RoPE (θ = 1e5); also the model of C3's ablations and the NTK-scaled runs of C4
    "standard": Role("smollm2-135m", "smollm2-135m", "smollm2", "smollm2-135m"),
    # RoPE trained with θ = 1e6
    "large-base": Role("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b", "qwen", "qwen2.5-coder-0.5b"),
    # 5 sliding layers of W = 512 to one global; its sequences are longer than the window
    "sliding": Role("gemma3-270m", "gemma3-270m", "gemma", "gemma3-270m (T > window)"),
    # C5's BOS replacements and their baseline: early queries only, so no need for T > window
    "bos": Role("gemma3-270m", "gemma3-270m-bos", "gemma-bos", "gemma3-270m"),
}
FINGERPRINT_ROLES: tuple[RoleName, ...] = ("sliding", "standard")  # C6: the models whose h_0 is compared


@dataclass(frozen=True)
class Plan:
    """Sizes of one reproduction, per sample (two disjoint samples); `--quick` fits in 15 minutes on 2 cores."""

    name: str
    seq_len: int
    num_seqs: int
    gemma_seq_len: int  # longer than Gemma's 512-token window, so that the sliding layers act
    gemma_num_seqs: int
    qwen_num_seqs: int
    ntk_factors: tuple[float, ...]
    control_draws: int  # C3: draws of as many random non-sink heads as there are sink heads
    fingerprint_seqs: int
    bootstrap: int
    lab_steps: int  # C4's controlled line: training steps of each lab model
    lab_seq_len: int
    lab_seeds: tuple[int, ...]
    lab_analyze_seqs: int
    batch_size: int = 4
    cross_documents: bool = False
    provisional: bool = False  # small samples: the report says its verdicts are provisional
    placement: Placement = field(default_factory=Placement)  # device and dtype of every analysis (posleak.device)

    def size(self, role: RoleName) -> tuple[int, int]:
        """T and N (per sample) of the analyses of `role`."""
        sizes: dict[RoleName, tuple[int, int]] = {
            "standard": (self.seq_len, self.num_seqs),
            "large-base": (self.seq_len, self.qwen_num_seqs),
            "sliding": (self.gemma_seq_len, self.gemma_num_seqs),
            "bos": (self.seq_len, self.num_seqs),
        }
        return sizes[role]


QUICK = Plan(
    name="quick",
    seq_len=256,
    num_seqs=8,
    gemma_seq_len=640,
    gemma_num_seqs=4,
    qwen_num_seqs=4,
    ntk_factors=(4.0, 16.0),
    control_draws=2,
    fingerprint_seqs=8,
    bootstrap=200,
    lab_steps=300,
    lab_seq_len=64,
    lab_seeds=(0, 1),
    lab_analyze_seqs=16,
    provisional=True,
)
FULL = Plan(
    name="full",
    seq_len=512,
    num_seqs=12,
    gemma_seq_len=768,
    gemma_num_seqs=6,
    qwen_num_seqs=6,
    ntk_factors=(2.0, 4.0, 16.0),
    control_draws=3,
    fingerprint_seqs=24,
    bootstrap=500,
    lab_steps=600,
    lab_seq_len=128,
    lab_seeds=(0, 1, 2),
    lab_analyze_seqs=32,
)
