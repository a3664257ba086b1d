"""Where a model runs and in what precision: `--device`, `--dtype`, `--device-map`, `--max-memory`.

A `Placement` is what a user states; `problems()` checks it against this machine before anything loads
(a device that is not there, a dtype the device cannot run, a malformed memory limit), so that a bad
placement is one `posleak: error:` line and nothing is written. Whether a model fits `--device-map auto`
is checked where its size is known, in `posleak.models.load`, still before any weight is read.

Precision (docs/method.md §4): the dtype changes what the model computes, its q, k and log Z; everything
posleak measures from them is formed in float32 (logits, from the model's q and k, which half precision
holds exactly in float32) and summed in float64, whatever the dtype, where the captures wait: on the model's
device when they stay there (the in-forward path; on the CPU for a device without float64, such as MPS:
`sums_device`), on the CPU when they went to the CPU's memory or to disk. `measure_budget` says how many bytes of
captures may stay on the model's device, so that each layer is measured during the last forward
(`--measure-budget`).

This module imports torch only inside the functions that need it, so the command line can offer the
choices without it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda", "mps")
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
DEVICE_MAPS: tuple[str, ...] = ("auto",)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


@dataclass(frozen=True)
class Placement:
    """The device, dtype and (for models larger than one device) device map a model loads with."""

    device: str = "auto"  # auto: CUDA where there is one, else MPS, else the CPU
    dtype: str = "float32"
    device_map: str | None = None  # "auto": accelerate spreads the layers over every device (and the CPU)
    max_memory: str | None = None  # with a device map: "cpu=8GiB,0=20GiB" (device = cpu or a CUDA index)

    def problems(self) -> list[str]:
        """Everything wrong with this placement on this machine, one message each; loads nothing."""
        found = []
        if self.device not in DEVICES:
            found.append(f"unknown --device {self.device!r}; use one of {', '.join(DEVICES)}")
        if self.dtype not in DTYPES:
            found.append(f"unknown --dtype {self.dtype!r}; use one of {', '.join(DTYPES)}")
        if self.device_map is not None and self.device_map not in DEVICE_MAPS:
            found.append(f"unknown --device-map {self.device_map!r}; use auto (or leave it out for one device)")
        if self.device_map is not None and self.device != "auto":
            found.append(
                f"--device-map {self.device_map} places every layer itself; drop --device {self.device} "
                "(or drop --device-map to run on one device)"
            )
        if self.max_memory is not None:
            if self.device_map is None:
                found.append("--max-memory limits what --device-map auto puts on each device; add --device-map auto")
            try:
                self.memory_limits()
            except ValueError as err:
                found.append(str(err))
        if found:
            return found
        if self.device == "cuda" and not _cuda_available():
            return [_no_cuda()]
        if self.device == "mps" and not _mps_available():
            return ["--device mps: this machine has no usable Apple GPU (MPS); use --device cpu or auto"]
        if self.device_map is None:
            device = self.torch_device()
            if reason := dtype_unsupported(self.dtype, device):
                return [
                    f"--dtype {self.dtype}: the {device.type} device cannot run it ({reason}); "
                    f"use --dtype float32{' or bfloat16' if self.dtype == 'float16' else ''}"
                ]
        return []

    def torch_device(self) -> torch.device:
        """The one device a model without a device map runs on."""
        import torch

        if self.device != "auto":
            return torch.device(self.device)
        if _cuda_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")

    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype)

    def memory_limits(self) -> dict[int | str, int] | None:
        """`max_memory` as accelerate takes it ({0: bytes, "cpu": bytes}); ValueError names what is malformed."""
        if self.max_memory is None:
            return None
        limits: dict[int | str, int] = {}
        for part in self.max_memory.split(","):
            name, _, size = part.strip().partition("=")
            key: int | str | None = name if name == "cpu" else int(name) if name.isdigit() else None
            amount = parse_size(size)
            if key is None or amount is None:
                raise ValueError(
                    f"--max-memory {self.max_memory!r}: {part.strip()!r} is not DEVICE=SIZE; use e.g. "
                    "cpu=8GiB,0=20GiB (DEVICE: cpu or a CUDA index; SIZE with B, KB, MB, GB, KiB, MiB or GiB)"
                )
            limits[key] = amount
        return limits

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_size(text: str) -> int | None:
    """A size with its unit ("20GiB", "512 MB", "1024B") in bytes; None when it is not one or not above 0."""
    number = text.strip().upper()
    unit = next((u for u in sorted(_UNITS, key=len, reverse=True) if number.endswith(u)), None)
    try:
        amount = float(number[: -len(unit)]) if unit else float("nan")
    except ValueError:
        amount = float("nan")
    return int(amount * _UNITS[unit]) if unit is not None and amount > 0 else None


def sums_device(device: torch.device) -> torch.device:
    """Where the float64 sums of q and k held on `device` are formed: there, where it has float64 (the CPU,
    CUDA); on the CPU where it has none (MPS)."""
    import torch

    if device.type in ("cpu", "cuda"):
        return device
    try:
        torch.zeros(1, dtype=torch.float64, device=device)
    except (RuntimeError, TypeError):
        return torch.device("cpu")
    return device


# Without --measure-budget, the share of the free CUDA memory that the captures may take on the in-forward path:
# the rest is for the forward itself and the measurement's float64 temporaries.
CUDA_BUDGET_SHARE = 0.5
# Without --measure-budget and without a run folder, captures up to this size stay in CPU memory (as before the
# in-forward path). With a run folder the CPU's captures go to disk: they are its checkpoints, and CPU forwards
# are slow to redo after a kill.
CPU_BUDGET_BYTES = 1 << 30


def measure_budget(spec: str, device: torch.device, *, run_folder: bool) -> int:
    """Bytes of captures that may stay on `device` (`spec`: "auto" or a size, `parse_size`): auto is
    CUDA_BUDGET_SHARE of the free memory on CUDA, CPU_BUDGET_BYTES on the CPU without a run folder, else 0."""
    import torch

    if spec != "auto":
        return _budget_bytes(spec) or 0
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0] * CUDA_BUDGET_SHARE)
    return CPU_BUDGET_BYTES if device.type == "cpu" and not run_folder else 0


def budget_problems(spec: str) -> list[str]:
    """What is wrong with a --measure-budget value."""
    if spec == "auto" or _budget_bytes(spec) is not None:
        return []
    return [f"--measure-budget {spec!r} is not a size; use auto, a number of bytes (0: always capture) or e.g. 8GiB"]


def _budget_bytes(spec: str) -> int | None:
    """A budget in bytes: a plain number (0 too) or a size with its unit."""
    return int(spec.strip()) if spec.strip().isdigit() else parse_size(spec)


def dtype_unsupported(dtype: str, device: torch.device) -> str | None:
    """Why `device` cannot run `dtype` (None: it can): the operations a forward with posleak's attention
    needs, tried on a few numbers. A device that lacks a kernel raises; CUDA before compute capability 8.0
    has no bfloat16 arithmetic (torch emulates some of it, slowly and not everywhere)."""
    import torch
    import torch.nn.functional as F

    if device.type == "cuda" and dtype == "bfloat16" and not torch.cuda.is_bf16_supported(including_emulation=False):
        return f"{torch.cuda.get_device_name(device)} has no bfloat16 arithmetic"
    try:
        x = torch.linspace(-1, 1, 32, device=device).reshape(1, 1, 4, 8).to(getattr(torch, dtype))
        F.scaled_dot_product_attention(x, x, x, is_causal=True)
        F.rms_norm(x, (8,)) @ x.transpose(-1, -2)
        torch.logsumexp(x.float(), dim=-1)
    except (RuntimeError, TypeError, NotImplementedError) as err:
        return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return None


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _mps_available() -> bool:
    import torch

    return torch.backends.mps.is_available()


def _no_cuda() -> str:
    import torch

    build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a build without CUDA"
    return (
        f"--device cuda: this machine has no CUDA device (torch {torch.__version__}, {build}); use --device cpu or auto"
    )
