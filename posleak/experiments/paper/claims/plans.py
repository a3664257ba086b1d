"""The reproduction's two built-in plans, QUICK (`posleak paper`, `make run`) and FULL (`--full`): the shared sizes
(posleak.experiments.paper.plan.Plan) and each claim's options, of the classes its package defines."""

from __future__ import annotations

from posleak.data import bible
from posleak.data.corpus import DEFAULT_CORPUS
from posleak.experiments.paper.claims.c1.options import C1Options
from posleak.experiments.paper.claims.c3.options import C3Options
from posleak.experiments.paper.claims.c4.options import C4Options
from posleak.experiments.paper.claims.c6.options import C6Options
from posleak.experiments.paper.plan import LabBudget, Plan

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
    sizes={
        "standard": (256, 16),  # 16 documents per sample, one window each (intervals over too few documents)
        "large-base": (256, 16),
        # 20 of the 22–24 documents a sample holds at T = 640 (above): its C1 and C2 rows were the widest that could
        # narrow below half their value, paid for by the scores and nulls --quick leaves out
        "sliding": (640, 20),
    },
    bootstrap=200,
    lab=LabBudget(steps=300, seq_len=64, seeds=(0, 1, 2, 3, 4), analyze_seqs=16),  # intervals over seeds want several
    sink_seq_len=256,
    options=(
        C1Options(nulls_both_samples=False),
        # control_draws: the full plan's 3 cost four more runs per unit and sample (two per question), for time
        C3Options(control_draws=1, both_bos=False, reported=False),
        C4Options(ntk_factors=(4.0, 16.0), lab_large_base=False),
        C6Options(fingerprint_seqs=8),
    ),
    provisional=True,
)
FULL = Plan(
    name="full",
    sizes={
        "standard": (512, 25),  # the most both corpora allow at T = 512 (above): 32 would need 80 documents that long
        "large-base": (512, 25),
        "sliding": (768, 20),  # the most the stdlib docstrings allow at T = 768
    },
    bootstrap=500,
    lab=LabBudget(steps=600, seq_len=128, seeds=(0, 1, 2, 3, 4), analyze_seqs=32),
    sink_seq_len=256,
    options=(
        C1Options(nulls_both_samples=True),
        C3Options(control_draws=3, both_bos=True, reported=True),
        # window_seq_len: 4W for gemma3-270m; 20 documents per sample, the most the Bible's sample B holds
        C4Options(ntk_factors=(2.0, 4.0, 16.0), lab_large_base=True, window_seq_len=2048),
        C6Options(fingerprint_seqs=24),
    ),
    corpora=(DEFAULT_CORPUS, bible.NAME),  # every claim on both corpora, side by side (method §13)
)
