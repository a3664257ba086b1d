"""C4's options in a plan (`Plan.options`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from posleak.data import bible


@dataclass(frozen=True)
class C4Options:
    """C4's NTK factors, its lab's lines and its window line."""

    ntk_factors: tuple[float, ...]  # the standard model under NTK-aware scaling by each factor
    # the lab also trains the model with a large RoPE base, whose line is reported, not judged (it is not NTK
    # scaling; lab.LAB_LINES): --quick leaves it out, for time (a third of the lab)
    lab_large_base: bool
    # the window line (window.py), judged once: the sliding model and the standard one at this T, N per sample, on
    # this corpus. None: not measured, and C4 cannot come out consistent (--quick, for time: its four analyses at
    # T = 2048 would take about 15 minutes on 2 cores). "Accumulates with depth" needs T ≥ 4W (docs/method.md §3:
    # gemma3-270m's W = 512, so 2048), which the stdlib docstrings cannot give (4 and 6 documents per sample reach
    # it) and the World English Bible can (20 and 21).
    window_seq_len: int | None = None
    window_num_seqs: int = 20
    window_corpus: str = bible.NAME
    file_keys: ClassVar[Mapping[str, str]] = {
        key: key for key in ("ntk_factors", "window_seq_len", "window_num_seqs", "window_corpus")
    }
