"""benchmarks/ablate_gdn_step.py: its variants are the kernels they claim to be, and bad
input exits 2 with one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from precisionlab.kernels.testing import kernel_device

kernel_device()  # the interpreter on the CPU, set before the script imports the kernels

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import ablate_gdn_step as ab  # noqa: E402
finally:
    sys.path.remove(str(ROOT / "benchmarks"))


def _tree_source() -> str:
    return Path(ab.gdn_step.__file__).read_text()


@pytest.mark.parametrize("stage", sorted(ab.STAGES))
def test_each_stage_patches_the_tree_and_imports(stage: str, tmp_path: Path) -> None:
    src = _tree_source()
    patched = ab.patched_source(stage, src)
    assert patched != src
    mod = ab.load_kernels(f"t_{stage.replace('-', '_')}", {"gdn_step": patched}, tmp_path)
    assert hasattr(mod, "_replay_kernel") and hasattr(mod, "_conventional_kernel")


def test_a_stage_that_no_longer_applies_is_a_usage_error() -> None:
    with pytest.raises(ab.AblateError, match="no longer applies"):
        ab.patched_source("normalisation", "def f():\n    pass\n")


def test_revision_kernels_load() -> None:
    try:
        sources = ab.revision_sources("HEAD")
    except ab.AblateError as e:
        pytest.skip(f"not a git checkout: {e}")
    assert set(sources) == set(ab.MODULES) and all("@triton.jit" in s for s in sources.values())


@pytest.mark.parametrize("argv,message", [
    ([], "give --leave-out"),
    (["--against", "no-such-revision-here"], "cannot read the kernels"),
    (["--model", "nemotron-3-nano-4b", "--against", "HEAD"], "mamba2 model"),
    (["--model", "no-such-model", "--against", "HEAD"], "no-such-model"),
    (["--against", "HEAD", "--batch", "32"], "staged launch"),
    (["--against", "HEAD", "--rounds", "3", "--reps", "2"], "rounds >= 2 x reps"),
    (["--leave-out", "ring-d", "--out", "/no/such/folder/x.json"], "no folder"),
])
def test_bad_input_exits_2_with_one_line(argv, message, capsys) -> None:
    assert ab.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_without_gpu_exits_2(tmp_path: Path, capsys) -> None:
    if ab.torch.cuda.is_available():
        pytest.skip("a GPU is present")
    out = tmp_path / "a.json"
    assert ab.main(["--leave-out", "ring-d", "--out", str(out)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err and not out.exists()


_RUN = r"""
import sys, tempfile, torch
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import ablate_gdn_step as ab
from precisionlab.kernels import gdn_decode as gd

def window(kernel):
    gd._replay_kernel, saved = kernel, gd._replay_kernel
    try:
        torch.manual_seed(0)
        c = gd.GDNReplayCache(2, 1, 2, 16, 16, window=4, checkpoint="fp32", device="cpu")
        c.reset(torch.randn(2, 2, 16, 16) * 0.1)
        g = torch.Generator().manual_seed(1)
        idx = torch.tensor([1, 0], dtype=torch.int32)
        outs = []
        for _ in range(3):
            r = lambda *s: torch.randn(*s, generator=g)
            outs.append(c.step(r(2, 1, 16), r(2, 1, 16), r(2, 2, 16), r(2, 2), r(2, 2),
                               torch.zeros(2), torch.zeros(2), idx).clone())
        return torch.stack(outs)
    finally:
        gd._replay_kernel = saved

tmp = Path(tempfile.mkdtemp())
tree = Path(ab.gdn_step.__file__).read_text()
same = ab.load_kernels("copy", {"gdn_step": tree}, tmp)._replay_kernel
ringless = ab.load_kernels("ringless", {"gdn_step": ab.patched_source("ring-d", tree)},
                           tmp)._replay_kernel
ref = window(gd._replay_kernel)
print("copy", torch.equal(window(same), ref))
print("ring-d", torch.equal(window(ringless), ref))
"""


def test_variants_run_as_built_under_the_interpreter(tmp_path: Path) -> None:
    """A variant built from the tree's own source gives the library's bits; one with the
    ring's d rows left out does not (so the patch reaches the compiled kernel)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", _RUN, str(ROOT / "benchmarks")],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "copy True" in r.stdout and "ring-d False" in r.stdout
