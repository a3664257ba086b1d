"""The reproduction's models and sizes, in one place: the role → model table, and each plan's per-role T and N.

A role is what a model stands for in the claims (the standard RoPE model, the sliding-window one, the one
trained with a large base, the one whose BOS C5 replaces); the claims name roles, never models, so that
changing a model here changes it everywhere. `ROLES` is the built-in set, the default; a plan's `roles`
(`posleak paper --models`, `--plan`: posleak.experiments.paper.models) may name any model for each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from posleak.data import bible
from posleak.data.corpus import DEFAULT_CORPUS
from posleak.device import Placement

SAMPLES = ("A", "B")
SHOWN = "A"  # the sample whose figures, tables and numbers the report's text shows
RoleName = Literal["standard", "large-base", "sliding", "bos"]
ROLE_NAMES: tuple[RoleName, ...] = get_args(RoleName)


@dataclass(frozen=True)
class Role:
    """One model of the reproduction: `folder` names its baseline run folder under OUT/runs/ (before the sample),
    `key` its entry in the manifest's runs, `label` how the claims' evidence names it."""

    model: str
    folder: str
    key: str
    label: str

    @property
    def name(self) -> str:
        """How the texts name the model: the last part of its spec (a folder's or a hub id's name), made safe for
        a folder name; a built-in's own name. Resolved first, so that `.` or `../ckpt/` name their folder."""
        from posleak.experiments.batch import safe_name  # here: batch imports pandas, which `paper --help` needs not

        return safe_name(Path(self.model).expanduser().resolve().name) or "model"


ROLES: dict[RoleName, Role] = {
    # standard RoPE (θ = 1e5); also the model of the NTK-scaled runs of C4
    "standard": Role("smollm2-135m", "smollm2-135m", "smollm2", "smollm2-135m"),
    # RoPE trained with θ = 1e6
    "large-base": Role("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b", "qwen", "qwen2.5-coder-0.5b"),
    # 5 sliding layers of W = 512 to one global; its sequences are longer than the window
    "sliding": Role("gemma3-270m", "gemma3-270m", "gemma", "gemma3-270m (T > window)"),
    # C5's BOS replacements and their baseline: early queries only, so no need for T > window
    "bos": Role("gemma3-270m", "gemma3-270m-bos", "gemma-bos", "gemma3-270m"),
}


def role_for(role: RoleName, model: str) -> Role:
    """The model `model` in `role`: the built-in entry where it is that role's built-in model (so that its run
    folders keep their names), else one named after the spec's last part (a folder's or a hub id's name), its
    manifest key the role's name."""
    if model == ROLES[role].model:
        return ROLES[role]
    name = Role(model, "", role, "").name
    folder = f"{name}-bos" if role == "bos" else name
    label = f"{name} (T > window)" if role == "sliding" else name
    return Role(model, folder, role, label)


@dataclass(frozen=True)
class Plan:
    """Sizes of one reproduction, per sample (two samples that share no document), the model of each role
    (`roles`, with per-role T and N in `sizes` where a plan file gives them) and the corpora; what each plan
    takes on 2 cores is measured in docs/performance.md."""

    name: str
    seq_len: int  # T and N of the standard role (and of the bos role, which follows it)
    num_seqs: int
    sliding_seq_len: int  # longer than the sliding model's window (gemma3-270m's 512), so that the window acts
    sliding_num_seqs: int
    large_base_num_seqs: int  # the large-base role's T is the standard one's
    ntk_factors: tuple[float, ...]
    control_draws: int  # C3: draws of matched non-sink heads, as many as there are sink heads (per unit)
    c3_both_bos: bool  # C3 also in each model's other BOS setting (--quick: its own only, for time)
    # C3's runs that are reported, not judged (value ablations, the whole position-0 patch) in each model's own BOS
    # setting (--quick leaves them out, for time: 3 to 4 runs per unit and sample)
    c3_reported: bool
    # the shuffle and shift nulls of the models C1 and C2 judge on both samples, or on the shown one (SHOWN) alone:
    # they are reported beside the magnitudes, never deciding (--quick: on A only, for time: 6 runs)
    nulls_both_samples: bool
    fingerprint_seqs: int
    bootstrap: int
    lab_steps: int  # C4's controlled line: training steps of each lab model
    lab_seq_len: int
    lab_seeds: tuple[int, ...]
    lab_analyze_seqs: int
    # C4's lab also trains the model with a large RoPE base, whose line is reported, not judged (it is not NTK
    # scaling; posleak.experiments.paper.claims.c4.lab.LAB_LINES): --quick leaves it out, for time (a third of the lab)
    lab_large_base: bool
    # T at which every claim chooses sink heads (α₀ > 0.3), on the selection sample, whatever T the runs judge at:
    # α₀ is a mean over queries and falls as T grows (smollm2-135m: 219 of 270 heads at T = 32, 128–145 at 256),
    # so a threshold at each run's own T moved which heads, and which layers, count (issue 44)
    sink_seq_len: int
    # C4's window line (posleak.experiments.paper.claims.c4.window), judged once: the sliding model and the standard
    # one at this T, N per sample, on this corpus. None: not measured, and C4 cannot come out consistent (--quick, for
    # time: its four analyses at T = 2048 would take about 15 minutes on 2 cores). "Accumulates with depth" needs
    # T ≥ 4W (docs/method.md §3: gemma3-270m's W = 512, so 2048), which the stdlib docstrings cannot give (4 and 6
    # documents per sample reach it) and the World English Bible can (20 and 21).
    window_seq_len: int | None = None
    window_num_seqs: int = 20
    window_corpus: str = bible.NAME
    batch_size: int = 4
    cross_documents: bool = False
    provisional: bool = False  # small samples: the report says its verdicts are provisional
    placement: Placement = field(default_factory=Placement)  # device and dtype of every analysis (posleak.device)
    roles: Mapping[RoleName, Role] = field(default_factory=lambda: dict(ROLES))  # the model of each role
    sizes: Mapping[RoleName, tuple[int, int]] = field(default_factory=dict)  # per role, T and N in place of below
    # The corpora every claim is judged on (`posleak paper --corpus`): each runs the whole reproduction once, the
    # lab line aside (posleak.experiments.paper.corpora); one corpus keeps the layout of a plain run.
    corpora: tuple[str, ...] = (DEFAULT_CORPUS,)

    @property
    def corpus(self) -> str:
        """The corpus the analyses draw their sequences from: the first (a plan of several runs once on each,
        with that one alone)."""
        return self.corpora[0]

    def size(self, role: RoleName) -> tuple[int, int]:
        """T and N (per sample) of the analyses of `role`: its own where `sizes` has them, else the plan's; the
        BOS role's follow the standard one's (C5 reads early queries only, so T need not exceed a window)."""
        if role in self.sizes:
            return self.sizes[role]
        sizes: dict[RoleName, tuple[int, int]] = {
            "standard": (self.seq_len, self.num_seqs),
            "large-base": (self.seq_len, self.large_base_num_seqs),
            "sliding": (self.sliding_seq_len, self.sliding_num_seqs),
        }
        return self.size("standard") if role == "bos" else sizes[role]


# How many sequences a sample can take: each is a window of a document of its own (one window per document,
# posleak.experiments.paper.reproduction), and A, B and the selection sample share the documents long enough for
# a window 2:2:1. With seed 0, per sample A / B / selection (posleak.experiments.paper.samples counts them before
# any work, refusing a plan they cannot hold), the documents that hold a window of T tokens:
#   stdlib docstrings (143 documents; Python 3.11):   T = 256: 40–43 / 40–42 / 20–21 (smollm2, gemma3, qwen2.5)
#                                                      T = 512: 27–29 / 28–29 / 13–14;  T = 640: 22–24 / 23–24 / 12
#                                                      T = 768: 18–20 / 21–22 / 9–11
#   World English Bible (66 books, 63 of them ≥ 640 tokens): T = 512: 25 / 26 / 13;  T = 768: 24–25 / 26 / 12
# --quick takes 16 per sample at T = 256 and 20 at T = 640. --full cannot take 32: at its T = 512 both corpora
# together hold 64–72 documents long enough, too few for 2 × 32 and a selection sample; it takes the most they allow,
# 25 at T = 512 (the Bible's sample A) and 20 at T = 768 (the stdlib's sample A with gemma3-270m's tokenizer).
QUICK = Plan(
    name="quick",
    seq_len=256,
    num_seqs=16,  # 16 documents per sample, one window each (issue 43: intervals over too few documents)
    sliding_seq_len=640,
    # 20 of the 22–24 documents a sample holds at T = 640 (above): its C1 and C2 rows were the widest that could
    # narrow below half their value (issue 43), paid for by the scores and nulls --quick leaves out
    sliding_num_seqs=20,
    large_base_num_seqs=16,
    ntk_factors=(4.0, 16.0),
    control_draws=1,  # the full plan's 3: four fewer runs per unit and sample (two per question), for time
    c3_both_bos=False,
    c3_reported=False,
    nulls_both_samples=False,
    fingerprint_seqs=8,
    bootstrap=200,
    lab_steps=300,
    lab_seq_len=64,
    lab_seeds=(0, 1, 2, 3, 4),  # C4's lab line: intervals over seeds want several
    lab_analyze_seqs=16,
    lab_large_base=False,
    sink_seq_len=256,
    provisional=True,
)
FULL = Plan(
    name="full",
    seq_len=512,
    num_seqs=25,  # the most both corpora allow at T = 512 (above): 32 would need 80 documents that long
    sliding_seq_len=768,
    sliding_num_seqs=20,  # the most the stdlib docstrings allow at T = 768
    large_base_num_seqs=25,
    ntk_factors=(2.0, 4.0, 16.0),
    control_draws=3,
    c3_both_bos=True,
    c3_reported=True,
    nulls_both_samples=True,
    fingerprint_seqs=24,
    bootstrap=500,
    lab_steps=600,
    lab_seq_len=128,
    lab_seeds=(0, 1, 2, 3, 4),
    lab_analyze_seqs=32,
    lab_large_base=True,
    sink_seq_len=256,
    window_seq_len=2048,  # 4W for gemma3-270m; 20 documents per sample, the most the Bible's sample B holds
    corpora=(DEFAULT_CORPUS, bible.NAME),  # every claim on both corpora, side by side (method §13)
)
