"""The read-copy encode launch (kernels/read_encode.py) against the torch formats: the
copy of every flushed matrix is ``formats``' encoding of the stored checkpoint, for
every dense checkpoint format, with special values (non-finite, signed zeros,
subnormals, the largest magnitude in either half of a 16-bit pair).

Runs compiled on a GPU, else in the Triton interpreter on the CPU (small shapes).
"""

from __future__ import annotations

import importlib
import sys

from precisionlab.kernels.testing import kernel_device

DEVICE = kernel_device()  # before the kernel modules are imported
if "precisionlab.kernels.read_encode" in sys.modules:  # compiled-mode leftovers
    importlib.reload(sys.modules["precisionlab.kernels.read_encode"])

import pytest  # noqa: E402
import torch  # noqa: E402

from precisionlab.kernels import read_encode  # noqa: E402
from precisionlab.kernels.gdn_decode import empty_store, store_into  # noqa: E402
from precisionlab.kernels.state import StateStore  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy, interpreter only

DEV = torch.device(DEVICE)
SLOTS, H, P, N, L = 3, 4, 64, 32, 4


def special_state() -> torch.Tensor:
    """(SLOTS, H, P, N) float32 states, one kind of matrix per head and slot: plain
    values; the largest magnitude negative and in an odd column (the high half of a
    16-bit pair); in an even column; signed zeros and fp16 subnormals; a +inf; a NaN;
    all zeros; values past fp16's range."""
    g = torch.Generator().manual_seed(5)
    S = torch.randn(SLOTS, H, P, N, generator=g)
    S[0, 1, 40, 7] = -9.5
    S[0, 2, 3, 10] = 11.25
    S[0, 3, :8] = -0.0
    S[0, 3, 8:16] = torch.randn(8, N, generator=g) * 2.0**-20
    S[1, 0, 17, 5] = float("inf")
    S[1, 1, 60, 30] = float("nan")
    S[1, 2] = 0.0
    S[1, 3, 33, 0] = 1.0e6
    return S


@pytest.mark.parametrize("amax_bits", [True, False], ids=["bits", "decoded"])
@pytest.mark.parametrize("rows", [16, 0], ids=["chunks", "default-rows"])
@pytest.mark.parametrize("ckpt", ["fp32", "fp16", "fp16-sr", "bf16", "bf16-sr"])
def test_copy_is_the_formats_encoding_of_the_checkpoint(ckpt: str, rows: int, amax_bits: bool,
                                                       monkeypatch) -> None:
    """Flushed slots (0 and 2) get ``formats``' nvfp4 encoding of the decoded checkpoint,
    bit for bit; slot 1 (not at the ring's last position) keeps its zeros."""
    monkeypatch.setattr(read_encode, "ENCODE_CTAS_PER_SM", 1)  # programs take several
    monkeypatch.setattr(read_encode, "ENCODE_ROWS", rows)
    monkeypatch.setattr(read_encode, "ENCODE_AMAX_BITS", amax_bits)
    S = special_state()
    S[2] = S[1]  # slot 2 flushes the special values of slot 1's row
    checkpoint = empty_store(ckpt, (SLOTS, H, P, N), DEV)
    store_into(checkpoint, S.to(DEV), seed=3, step=1)
    copy = empty_store("nvfp4", (SLOTS, H, P, N), DEV)
    tickets = torch.tensor([L - 1, 0, 2 * L - 1], dtype=torch.int32, device=DEV)
    idx = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)
    read_encode.encode_read_copies(checkpoint, copy, tickets, idx, L, 1, 2)
    want = StateStore.encode(checkpoint.decode().cpu(), "nvfp4", seed=0, step=0)
    for got, ref in zip(copy.tensors(), want.tensors(), strict=True):
        got, ref = got.cpu(), ref.reshape(got.shape)
        for slot in (0, 2):
            assert torch.equal(got[slot], ref[slot]), (ckpt, slot)
        assert not got[1].any()


def test_amax_bits_pass_reads_both_halves_of_a_word() -> None:
    """The largest magnitude of a 16-bit checkpoint found in the low half of a word
    (even column) and in the high half (odd column) gives the same nvfp4 matrix scale
    as the decoded values."""
    for col in (6, 7):
        S = torch.full((1, 1, P, N), 0.25)
        S[0, 0, 50, col] = -3.0
        checkpoint = empty_store("fp16", (1, 1, P, N), DEV)
        store_into(checkpoint, S.to(DEV), seed=0, step=0)
        copy = empty_store("nvfp4", (1, 1, P, N), DEV)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(read_encode, "ENCODE_ROWS", 16)
            read_encode.encode_read_copies(
                checkpoint, copy, torch.tensor([L - 1], dtype=torch.int32, device=DEV),
                torch.zeros(1, dtype=torch.int32, device=DEV), L, 1, 1)
        assert copy.s2.item() == pytest.approx(3.0 / 2688.0, rel=1e-7), col


def test_encode_programs_keep_32_elements_per_thread(monkeypatch) -> None:
    """One warp per 1024 elements of a tile (2 to 8), 32 warps per SM: 4-warp programs,
    8 per SM, for 32-row tiles of 128 columns; 2-warp ones, 16 per SM, for 16-row chunks
    (nemotron-3-nano-4b's 80-row matrices); 8-warp ones, 4 per SM, for 64 rows and more;
    the module settings override either."""
    assert read_encode.encode_programs(32, 128) == (4, 8)  # qwen3.5: 32-row chunks
    assert read_encode.encode_programs(64, 128) == (8, 4)  # super-120b: one tile
    assert read_encode.encode_programs(128, 128) == (8, 4)
    assert read_encode.encode_programs(read_encode.encode_rows(80, 128, 2), 128) == (2, 16)
    monkeypatch.setattr(read_encode, "ENCODE_WARPS", 4)
    monkeypatch.setattr(read_encode, "ENCODE_CTAS_PER_SM", 8)
    assert read_encode.encode_programs(16, 128) == (4, 8)
