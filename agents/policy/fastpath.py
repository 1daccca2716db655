"""CPU fast path: which precision this machine should run in, and MKL-packed linear layers for decoding.

Precision. bf16 only pays on a CPU that multiplies bf16 in hardware (AMX tiles or AVX512-BF16): there a bf16 matmul
runs ~8x faster than fp32. Without them, PyTorch converts bf16 to fp32 inside every kernel and a bf16 matmul runs 3-4x
*slower* than fp32 (measured on an AVX-512 Ice Lake: 62 vs 218 GFLOP/s at 2048^3). So ``precision="auto"`` picks bf16
only where the hardware has it (or on a GPU that supports it) and fp32 elsewhere; ``"bf16"`` forces it, ``"fp32"``
turns it off. ``RLVR_CPU_BF16=0|1`` overrides the detection (for tests and for CPUs the detection misjudges).

Packed linears. Decoding multiplies a handful of rows by every weight matrix each token. MKL's ``sgemm`` picks a
slow path for such skinny products (a [16,576] x [576,1536] product runs at ~50 GFLOP/s out of ~220), while the
same product against a weight pre-packed once with ``cblas_sgemm_pack`` (``torch.ops.mkl._mkl_reorder_linear_weight``,
the kernel behind Inductor's CPU weight freezing) runs 2-3x faster for 4-48 rows and about as fast at 1-2 and 64
rows (above ``max_rows`` the ordinary product runs). The result is the same sgemm arithmetic (differences are fp32
rounding, ~1e-5). ``PackedLinearCache.applied(model)`` swaps every fp32 CPU ``nn.Linear``'s forward for the packed
product for the duration of a ``with`` block and restores it after, even on error. Packed copies are cached per weight and rebuilt when the weight changes (a training step bumps the
tensor's version counter), so a trainer that decodes between optimizer steps repacks once per step (~0.1 s for
SmolLM2-135M). The packed copies take as much memory as the weights (+514 MB resident for SmolLM2-135M).
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterator
from typing import Any

import torch

PRECISIONS = ("auto", "fp32", "bf16")


def cpu_has_bf16_matmul() -> bool:
    """True when this CPU multiplies bf16 in hardware (AMX or AVX512-BF16); ``RLVR_CPU_BF16`` overrides."""
    forced = os.environ.get("RLVR_CPU_BF16", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def resolve_precision(precision: str, device: torch.device | str = "cpu") -> str:
    """``"fp32"`` or ``"bf16"`` for ``precision`` in :data:`PRECISIONS` on ``device``."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision != "auto":
        return precision
    device = torch.device(device)
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    if device.type == "cpu":
        return "bf16" if cpu_has_bf16_matmul() else "fp32"
    return "fp32"


def mkl_packing_available() -> bool:
    return bool(torch._C.has_mkl) and hasattr(torch.ops.mkl, "_mkl_linear")


class PackedLinearCache:
    """Packed copies of a model's fp32 CPU ``nn.Linear`` weights, rebuilt when a weight changes.

    ``max_rows``: inputs with more rows than this use the ordinary product (packing stops paying off around 64 rows).
    """

    def __init__(self, max_rows: int = 64) -> None:
        self.max_rows = max_rows
        self._packed: weakref.WeakKeyDictionary[torch.nn.Linear, tuple[tuple[int, int], torch.Tensor]] = (
            weakref.WeakKeyDictionary())
        self.repacks = 0  # how many weights were (re)packed: lets callers and tests see the cache work

    def packed(self, linear: torch.nn.Linear) -> torch.Tensor:
        weight = linear.weight
        key = (weight.data_ptr(), weight._version)
        hit = self._packed.get(linear)
        if hit is not None and hit[0] == key:
            return hit[1]
        with torch.no_grad():
            packed = torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), self.max_rows)
        self._packed[linear] = (key, packed)
        self.repacks += 1
        return packed

    def clear(self) -> None:
        """Forget every packed weight (after an update the version counter may not show: fused optimizers)."""
        self._packed.clear()

    @staticmethod
    def eligible(module: torch.nn.Module) -> bool:
        w = getattr(module, "weight", None)
        return (isinstance(module, torch.nn.Linear) and isinstance(w, torch.Tensor) and w.dtype == torch.float32
                and w.device.type == "cpu" and w.dim() == 2)

    @contextlib.contextmanager
    def applied(self, model: torch.nn.Module) -> Iterator[int]:
        """Within the block, eligible linears of ``model`` run the packed product; yields how many were swapped.
        Meant for inference (``torch.inference_mode``): the packed op has no autograd formula."""
        if not mkl_packing_available():
            yield 0
            return
        swapped: list[torch.nn.Module] = []
        try:
            for module in model.modules():
                if self.eligible(module) and "forward" not in module.__dict__:
                    module.forward = self._forward_for(module)
                    swapped.append(module)
            yield len(swapped)
        finally:
            for module in swapped:
                module.__dict__.pop("forward", None)

    def _forward_for(self, linear: torch.nn.Linear) -> Any:
        original = type(linear).forward.__get__(linear)
        max_rows = self.max_rows

        def forward(x: torch.Tensor) -> torch.Tensor:
            rows = x.numel() // max(1, x.shape[-1])
            if rows > max_rows or x.dtype != torch.float32 or torch.is_grad_enabled():
                return original(x)
            packed = self.packed(linear)
            flat = x.reshape(rows, x.shape[-1])
            bias = linear.bias.detach() if linear.bias is not None else None
            out = torch.ops.mkl._mkl_linear(flat, packed, linear.weight.detach(), bias, rows)
            return out.reshape(*x.shape[:-1], out.shape[-1])

        return forward
