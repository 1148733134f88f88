"""Device storage of a batch of state matrices in one format (the kernels' view of
a :class:`precisionlab.formats.Packed` value).

A :class:`StateStore` holds ``(slots, heads, rows, cols)`` matrices as the tensors
``codes, s1, s2`` laid out exactly as ``formats.get(fmt).encode`` lays them out
(see :mod:`precisionlab.kernels.tl_formats`), so ``store.packed()`` can be
decoded by the torch formats and compared bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from precisionlab import formats

from .tl_formats import FMT_FP8, FMT_MXFP4, FMT_NVFP4, format_id

_CODE_DTYPE = {"fp32": torch.float32, "bf16": torch.int16, "fp16": torch.int16,
               "bf16-sr": torch.int16, "fp16-sr": torch.int16}
DENSE_FORMATS = tuple(_CODE_DTYPE)
"""Formats stored as one plain ``(..., rows, cols)`` array, without scales."""


def split_unsupported(checkpoint: str, read: str | None) -> str | None:
    """Why the kernels cannot keep a split design with these copies, or None.  A read
    copy encodes the checkpoint's stored values, which an nvfp4 checkpoint (its scale
    needs the whole matrix) does not give the flush's encoders row by row."""
    if read is not None and checkpoint == "nvfp4":
        return "the kernels keep no read copy beside an nvfp4 checkpoint"
    return None


@dataclass
class StateStore:
    """``(slots, heads, rows, cols)`` state matrices stored in format ``fmt``.

    ``codes``: fp32 values, int16 bits (16-bit formats) or uint8 codes; ``s1``: fp8
    row scales (..., rows, 1), nvfp4 E4M3 / mxfp4 E8M0 block scales; ``s2``: nvfp4
    matrix scales (..., 1, 1).
    """

    fmt: str
    codes: torch.Tensor
    s1: torch.Tensor | None = None
    s2: torch.Tensor | None = None
    _descriptors: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def fmt_id(self) -> int:
        return format_id(self.fmt)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        s, h, r, c = self.codes.shape
        packed = self.fmt_id in (FMT_NVFP4, FMT_MXFP4)
        return (s, h, r, c * 2 if packed else c)

    @classmethod
    def empty(cls, fmt: str, shape: tuple[int, int, int, int],
              device: torch.device | str) -> StateStore:
        """Uninitialised storage for ``shape = (slots, heads, rows, cols)``."""
        fid = format_id(fmt)
        s, h, r, c = shape
        u8 = dict(dtype=torch.uint8, device=device)
        if fid == FMT_FP8:
            return cls(fmt, torch.empty(shape, **u8),
                       torch.empty((s, h, r, 1), dtype=torch.float32, device=device))
        if fid == FMT_NVFP4:
            if c % 16:
                raise ValueError("nvfp4 needs cols divisible by 16")
            return cls(fmt, torch.empty((s, h, r, c // 2), **u8),
                       torch.empty((s, h, r, c // 16), **u8),
                       torch.empty((s, h, 1, 1), dtype=torch.float32, device=device))
        if fid == FMT_MXFP4:
            if c % 32:
                raise ValueError("mxfp4 needs cols divisible by 32")
            return cls(fmt, torch.empty((s, h, r, c // 2), **u8),
                       torch.empty((s, h, r, c // 32), **u8))
        return cls(fmt, torch.empty(shape, dtype=_CODE_DTYPE[fmt], device=device))

    @classmethod
    def from_packed(cls, packed: formats.Packed) -> StateStore:
        """Wrap a formats value of shape (slots, heads, rows, cols)."""
        fid = format_id(packed.format)
        codes = packed.codes
        if codes.dtype == torch.int32:
            codes = codes.view(torch.float32)
        sc = packed.scales
        if fid == FMT_FP8:
            return cls(packed.format, codes, sc["row"].contiguous())
        if fid == FMT_NVFP4:
            return cls(packed.format, codes, sc["block"].contiguous(), sc["matrix"].contiguous())
        if fid == FMT_MXFP4:
            return cls(packed.format, codes, sc["block"].contiguous())
        return cls(packed.format, codes.contiguous())

    @classmethod
    def encode(cls, S: torch.Tensor, fmt: str, *, seed: int = 0, step: int = 0) -> StateStore:
        """Encode a float tensor with the torch formats (initial states, tests)."""
        return cls.from_packed(formats.get(fmt).encode(S.float().contiguous(), seed=seed,
                                                       step=step))

    def packed(self) -> formats.Packed:
        """This storage as a formats value (views, no copy)."""
        fid = self.fmt_id
        codes = self.codes.view(torch.int32) if self.codes.dtype == torch.float32 else self.codes
        scales: dict[str, torch.Tensor] = {}
        if fid == FMT_FP8:
            scales["row"] = self.s1
        elif fid == FMT_NVFP4:
            scales["block"], scales["matrix"] = self.s1, self.s2
        elif fid == FMT_MXFP4:
            scales["block"] = self.s1
        return formats.Packed(self.fmt, codes, self.shape, scales)

    def decode(self) -> torch.Tensor:
        """float32 values, decoded by the torch formats."""
        return formats.get(self.fmt).decode(self.packed())

    def copy_(self, other: StateStore) -> StateStore:
        """Copy another store of the same format and shape into this one."""
        if other.fmt != self.fmt:
            raise ValueError(f"cannot copy a {other.fmt} store into a {self.fmt} store")
        for mine, theirs in zip(self.tensors(), other.tensors(), strict=True):
            mine.copy_(theirs)
        return self

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.codes, self.s1, self.s2) if t is not None]

    def kernel_args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(codes, s1, s2)`` for a kernel launch (missing scales alias ``codes``)."""
        return (self.codes, self.s1 if self.s1 is not None else self.codes,
                self.s2 if self.s2 is not None else self.codes)

    def rows_descriptor(self, block_rows: int) -> TensorDescriptor:
        """Tensor descriptor of a dense store's codes as one ``(slots * heads * rows,
        cols)`` array in blocks of ``block_rows`` rows (the flushes' TMA loads); built
        once per buffer and block."""
        if self.fmt not in DENSE_FORMATS:
            raise ValueError(f"a {self.fmt} store is not one plain array of rows")
        codes = self.codes
        key = (codes.data_ptr(), block_rows)
        if key not in self._descriptors:
            cols = codes.shape[-1]
            self._descriptors[key] = TensorDescriptor.from_tensor(codes.view(-1, cols),
                                                                  [block_rows, cols])
        return self._descriptors[key]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())
