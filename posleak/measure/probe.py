"""The position probe of docs/method.md §7 (Haviv et al., arXiv 2203.16634): how linearly h_i^(l) encodes i.

Per layer, a ridge regression from the hidden state h_i^(l) (`ResidualCapture`'s resid[l]: resid[0]
the embedding module's output, resid[l] the output of block l − 1) to log(1 + i) and to i.

- **Splits are by sequence**, never by position: positions of one sequence share their content, so a
  probe tested on other positions of its training sequences would be credited with memorising them.
  The first `train_fraction` of the sequences (input order) train, the rest are held out.
- **The regulariser** α is chosen per layer and target on a validation split: the last
  `val_fraction` of the training sequences score each α of the grid (fitted on the others), the best
  is refitted on all training sequences. Features are standardised with training statistics and the
  penalty is α·n (n training rows), so the grid means the same at any number of rows.
- **Shuffled-position control**: the same procedure with the training targets permuted across rows
  (seeded), scored against the true held-out targets. It measures what the probe gets from nothing;
  its R² sits at or below 0.

Reported per layer and target: held-out R² and mean absolute error (in the target's units: nats of
log(1 + i), or positions), the chosen α, and the control's R² and MAE.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from transformers import PreTrainedModel

from posleak.capture.residual import ResidualCapture, base_of
from posleak.errors import PosleakError

TARGETS: tuple[str, ...] = ("log1p", "linear")
PROBE_COLUMNS = ("layer", "target", "r2", "mae", "alpha", "r2_shuffled", "mae_shuffled")


@dataclass(frozen=True)
class ProbeConfig:
    """Splits, the ridge grid and the control's seed."""

    train_fraction: float = 0.5
    val_fraction: float = 0.25
    alphas: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)
    seed: int = 0
    batch_size: int = 8
    layers: tuple[int, ...] | None = None  # resid indices; None: all

    def __post_init__(self) -> None:
        for name in ("train_fraction", "val_fraction"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise PosleakError(f"probe {name} {getattr(self, name)} must lie strictly between 0 and 1")


@torch.no_grad()
def capture_states(
    model: PreTrainedModel, ids: torch.Tensor, layers: Sequence[int] | None, batch_size: int
) -> torch.Tensor:
    """h_i^(l) at every position: (layers, N, T, d), float32."""
    with ResidualCapture(model, positions=range(ids.shape[1]), layers=layers) as capture:
        for start in range(0, ids.shape[0], batch_size):
            base_of(model)(input_ids=ids[start : start + batch_size].to(model.device), use_cache=False)
    return capture.states()


def probe_positions(model: PreTrainedModel, ids: torch.Tensor, config: ProbeConfig | None = None) -> pd.DataFrame:
    """The probe table (columns PROBE_COLUMNS) of `model` on the sequences `ids` (N×T)."""
    config = config or ProbeConfig()
    num_seqs, seq_len = ids.shape
    n_train = int(num_seqs * config.train_fraction)
    n_fit = n_train - int(n_train * config.val_fraction)
    if n_fit < 1 or n_train == n_fit or n_train == num_seqs:
        raise PosleakError(
            f"the position probe needs sequences for fitting, validation and testing; {num_seqs} are too few "
            "(use at least 8)"
        )
    states = capture_states(model, ids, config.layers, config.batch_size)
    layers = list(config.layers) if config.layers is not None else list(range(states.shape[0]))
    positions = np.arange(seq_len, dtype=np.float64)
    rows = []
    for index, layer in enumerate(layers):
        features = states[index].double().numpy()  # (N, T, d)
        for target in TARGETS:
            y = np.log1p(positions) if target == "log1p" else positions
            rows.append({"layer": layer, "target": target, **_probe_one(features, y, n_fit, n_train, config)})
    return pd.DataFrame(rows, columns=list(PROBE_COLUMNS))


def best_r2(table: pd.DataFrame, target: str = "log1p") -> float:
    """The highest held-out R² over layers for `target` (a model's single probe number)."""
    return float(table.loc[table["target"] == target, "r2"].max())


def _probe_one(features: np.ndarray, y: np.ndarray, n_fit: int, n_train: int, config: ProbeConfig) -> dict[str, float]:
    num_seqs, seq_len, _ = features.shape
    targets = np.broadcast_to(y, (num_seqs, seq_len))
    x_train, y_train = features[:n_train].reshape(-1, features.shape[-1]), targets[:n_train].reshape(-1)
    x_test, y_test = features[n_train:].reshape(-1, features.shape[-1]), targets[n_train:].reshape(-1)
    fit_rows = n_fit * seq_len
    alpha, r2, mae = _select_and_score(x_train, y_train, x_test, y_test, fit_rows, config.alphas)
    shuffled = np.random.default_rng(config.seed).permutation(y_train)
    _, r2_shuffled, mae_shuffled = _select_and_score(x_train, shuffled, x_test, y_test, fit_rows, config.alphas)
    return {"r2": r2, "mae": mae, "alpha": alpha, "r2_shuffled": r2_shuffled, "mae_shuffled": mae_shuffled}


def _select_and_score(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    fit_rows: int,
    alphas: Sequence[float],
) -> tuple[float, float, float]:
    """Pick α on the validation rows (training rows past fit_rows), refit on all training rows, score the test rows."""
    val_scores = [
        _r2(y_train[fit_rows:], Ridge(x_train[:fit_rows], y_train[:fit_rows]).predict(x_train[fit_rows:], alpha))
        for alpha in alphas
    ]
    alpha = float(alphas[int(np.argmax(val_scores))])
    predicted = Ridge(x_train, y_train).predict(x_test, alpha)
    return alpha, _r2(y_test, predicted), float(np.abs(predicted - y_test).mean())


class Ridge:
    """Closed-form ridge on standardised features, solved for any α from one eigendecomposition."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.mean = x.mean(axis=0)
        self.scale = x.std(axis=0)
        self.scale[self.scale == 0] = 1.0  # a constant feature carries nothing; leave it at 0
        z = (x - self.mean) / self.scale
        self.y_mean = float(y.mean())
        self.rows = x.shape[0]
        self.eigvals, self.eigvecs = np.linalg.eigh(z.T @ z)
        self.projected = self.eigvecs.T @ (z.T @ (y - self.y_mean))

    def predict(self, x: np.ndarray, alpha: float) -> np.ndarray:
        weights = self.eigvecs @ (self.projected / (self.eigvals + alpha * self.rows))
        return ((x - self.mean) / self.scale) @ weights + self.y_mean


def _r2(y: np.ndarray, predicted: np.ndarray) -> float:
    total = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - predicted) ** 2).sum()) / total if total > 0 else float("nan")
