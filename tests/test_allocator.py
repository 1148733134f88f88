"""``reuse_freed_memory`` keeps freed large blocks for the next allocation (fewer page
faults per step of a CPU study) and the command line turns it on."""

from __future__ import annotations

import subprocess
import sys

import pytest

from precisionlab import allocator

FAULTS = """
import resource, sys
import torch
torch.set_num_threads(1)            # no pool threads allocating beside the blocks
if sys.argv[1] == "1":
    from precisionlab.allocator import reuse_freed_memory
    assert reuse_freed_memory()
n = 64 * 2**20 // 4                 # 64 MB: above glibc's largest default mmap threshold
for _ in range(8):                  # the heap grows to its working size first
    torch.ones(n)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    torch.ones(n)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(reuse: bool) -> int:
    out = subprocess.run([sys.executable, "-c", FAULTS, "1" if reuse else "0"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(allocator.glibc_mallopt() is None, reason="glibc's mallopt only")
def test_freed_large_blocks_are_reused_without_faulting_their_pages_again() -> None:
    pages = 4 * 64 * 2**20 // 4096
    assert _faults(False) > 0.9 * pages, "without the setting each block faults its pages"
    # the fewest of three runs: a busy machine now and then faults one block in again
    assert min(_faults(True) for _ in range(3)) < pages // 8, (
        "with it most blocks reuse pages already there")


def test_the_command_line_turns_it_on(monkeypatch) -> None:
    from precisionlab import cli

    calls = []
    monkeypatch.setattr(allocator, "reuse_freed_memory", lambda: calls.append(1) or True)
    monkeypatch.setattr(sys, "argv", ["precisionlab", "formats"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code in (0, None) and calls == [1]
