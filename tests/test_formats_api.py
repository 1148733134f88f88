"""The Format contract for every registered format, the registry (names, get,
errors, register), describe(), and entry-point plug-ins."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import precisionlab.formats as F
from precisionlab.formats import Format, FormatError, Packed, UnknownFormatError

NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, NO_CUDA])]

BUILTINS = [
    "fp32", "bf16", "fp16", "bf16-sr", "fp16-sr",
    "fp8-e4m3", "fp8-e5m2", "mxfp8", "nvfp4", "mxfp4",
]  # fmt: skip
BLOCK = {"mxfp8": 32, "mxfp4": 32, "nvfp4": 16}
# relative RMS error bound on Gaussian data (sanity, far from the actual values)
RMS_BOUND = {
    "fp32": 0.0, "bf16": 2**-8, "fp16": 2**-11, "bf16-sr": 2**-7, "fp16-sr": 2**-10,
    "fp8-e4m3": 0.04, "fp8-e5m2": 0.08, "mxfp8": 0.05, "nvfp4": 0.12, "mxfp4": 0.2,
}  # fmt: skip
PLUGIN_SRC = Path(__file__).parent / "plugin_pkg"


# ---- registry


def test_builtin_names_in_order():
    assert F.names()[: len(BUILTINS)] == BUILTINS
    for name in BUILTINS:
        fmt = F.get(name)
        assert isinstance(fmt, Format) and fmt.name == name
        assert F.get(fmt) is fmt


def test_unknown_name_lists_known_formats():
    with pytest.raises(UnknownFormatError) as err:
        F.get("fp7")
    msg = str(err.value)
    assert "'fp7'" in msg and all(name in msg for name in BUILTINS)
    assert isinstance(err.value, KeyError)


def test_register_decorator_and_instance():
    try:

        @F.register(name="test-fp16-alias")
        class Alias(type(F.get("fp16"))):
            pass

        assert isinstance(F.get("test-fp16-alias"), Alias)
        assert F.names()[-1] == "test-fp16-alias"
        x = torch.randn(8, 16)
        assert torch.equal(F.get("test-fp16-alias").quantize(x), F.get("fp16").quantize(x))

        F.register(Alias(), name="test-instance")
        assert F.get("test-instance").name == "test-instance"
        with pytest.raises(TypeError):
            F.register(object())
    finally:
        F.unregister("test-fp16-alias")
        F.unregister("test-instance")
    assert "test-fp16-alias" not in F.names()


def test_describe_all():
    keys = {
        "name", "bits_per_element", "block", "scale", "rounding",
        "max_normal", "min_subnormal", "exponent_bits", "mantissa_bits",
    }  # fmt: skip
    rows = [F.describe(name) for name in BUILTINS]
    json.dumps(rows)  # JSON-ready
    for row in rows:
        assert set(row) == keys
        fmt = F.get(row["name"])
        assert row["bits_per_element"] == fmt.bits_per_element()
        assert row["block"] == BLOCK.get(row["name"])
        assert row["rounding"] == ("stochastic" if row["name"].endswith("-sr") else "nearest-even")
    by = {r["name"]: r for r in rows}
    assert by["nvfp4"]["bits_per_element"] == 4.5 + 32 / 128**2
    assert by["fp8-e4m3"]["max_normal"] == 448.0 and by["mxfp4"]["max_normal"] == 6.0
    assert by["fp16"]["min_subnormal"] == 2.0**-24


# ---- the contract, for every built-in format


def _x(shape, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", BUILTINS)
def test_contract(name, device):
    fmt = F.get(name)
    for shape in [(64,), (4, 64), (2, 3, 4, 64)]:
        x = _x(shape, device)
        before = x.clone()
        p = fmt.encode(x, seed=3, step=1)
        assert isinstance(p, Packed) and p.format == name and p.shape == shape
        assert p.codes.device.type == device
        q = fmt.decode(p)
        assert q.dtype == torch.float32 and q.shape == shape and q.device.type == device
        assert torch.equal(q, fmt.quantize(x, seed=3, step=1))
        assert torch.equal(x, before)  # input untouched
        assert p.nbytes() * 8 == pytest.approx(fmt.bits_per_element(shape) * x.numel())
        rms = ((q - x).norm() / x.norm()).item()
        assert rms <= RMS_BOUND[name]
    if not fmt.stochastic:  # seed and step are ignored by round-to-nearest formats
        x = _x((4, 64), device)
        assert torch.equal(fmt.encode(x, seed=1).codes, fmt.encode(x, seed=2, step=5).codes)


@pytest.mark.parametrize("name", BUILTINS)
def test_zero_nan_inf(name):
    fmt = F.get(name)
    assert torch.equal(fmt.quantize(torch.zeros(3, 64)), torch.zeros(3, 64))
    x = _x((4, 64))
    x[0, 5], x[1, 17], x[2, 40] = float("nan"), float("inf"), -float("inf")
    q = fmt.quantize(x)
    assert torch.isnan(q[0, 5])  # NaN never becomes finite
    assert not torch.isfinite(q[1, 17]) and not torch.isfinite(q[2, 40])  # nor does inf
    clean = torch.where(torch.isfinite(x), x, 0.0)
    assert torch.equal(q[3], fmt.quantize(clean)[3])  # a clean row is unaffected


@pytest.mark.parametrize("name", BUILTINS)
def test_input_dtypes_and_layout(name):
    fmt = F.get(name)
    x = _x((8, 64))
    ref = fmt.encode(x, seed=1).codes
    for dt in (torch.float64, torch.float16, torch.bfloat16):
        xd = x.to(dt)
        assert torch.equal(fmt.encode(xd, seed=1).codes, fmt.encode(xd.float(), seed=1).codes)
    t = _x((64, 8)).t()  # non-contiguous
    assert torch.equal(fmt.encode(t, seed=1).codes, fmt.encode(t.contiguous(), seed=1).codes)
    with pytest.raises(FormatError):
        fmt.encode(torch.ones(8, 64, dtype=torch.int32))
    other = "fp16" if name != "fp16" else "bf16"
    with pytest.raises(FormatError):
        fmt.decode(F.get(other).encode(x))
    assert ref.shape[0] == 8
    if name in BLOCK:
        with pytest.raises(FormatError, match=f"multiple of {BLOCK[name]}, got 40"):
            fmt.encode(torch.zeros(2, 40))
    if name in ("fp32", "bf16", "fp16", "bf16-sr", "fp16-sr"):
        assert fmt.quantize(torch.tensor(1.5)).shape == ()  # 0-d is fine without scales


# ---- entry-point plug-ins


@pytest.fixture
def plugin_on_path(tmp_path):
    """Make a directory importable and rescan plug-ins; undo both afterwards."""
    added = []

    def add(path: Path) -> None:
        sys.path.insert(0, str(path))
        added.append(str(path))
        importlib.invalidate_caches()
        F.reload_plugins()

    yield add
    for path in added:
        sys.path.remove(path)
    sys.modules.pop("precisionlab_demo_plugin", None)
    importlib.invalidate_caches()
    F.reload_plugins()
    assert "bf16-rz" not in F.names()


def _check_plugin() -> None:
    assert "bf16-rz" in F.names() and F.names()[: len(BUILTINS)] == BUILTINS
    fmt = F.get("bf16-rz")
    assert fmt.name == "bf16-rz" and type(fmt).__name__ == "BF16TowardZero"
    x = torch.tensor([1.0 + 2**-8 + 2**-9, -3.999, float("nan")])
    q = fmt.quantize(x)
    assert q[0] == 1.0 + 2**-8 - 2**-8 and q[1] == -3.984375 and torch.isnan(q[2])


def test_entry_point_plugin_from_dist_info(tmp_path, plugin_on_path):
    """An installed distribution is a package plus a .dist-info with entry_points.txt;
    write exactly that (from the plug-in's pyproject) into a temp dir on sys.path."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((PLUGIN_SRC / "pyproject.toml").read_text())["project"]
    shutil.copytree(PLUGIN_SRC / "precisionlab_demo_plugin", tmp_path / "precisionlab_demo_plugin")
    info = tmp_path / "precisionlab_demo_plugin-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    eps = project["entry-points"][F.ENTRY_POINT_GROUP]
    lines = "".join(f"{k} = {v}\n" for k, v in eps.items())
    (info / "entry_points.txt").write_text(f"[{F.ENTRY_POINT_GROUP}]\n{lines}")
    assert "bf16-rz" not in F.names()
    plugin_on_path(tmp_path)
    _check_plugin()


def test_entry_point_plugin_pip_install(tmp_path, plugin_on_path):
    """The real thing: pip-install the plug-in package into a temp target (offline)."""
    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    shutil.copytree(PLUGIN_SRC, src)  # keep build litter out of the repo
    target = tmp_path / "site"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
           "--no-index", "--target", str(target), str(src)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        pytest.skip(f"pip could not build the plug-in here: {res.stderr[-500:]}")
    plugin_on_path(target)
    _check_plugin()


def test_broken_plugin_is_skipped_with_warning(tmp_path, plugin_on_path):
    info = tmp_path / "broken_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[{F.ENTRY_POINT_GROUP}]\nbroken = no_such_module_xyz:Thing\nfp16 = math:pi\n"
    )
    with pytest.warns(UserWarning) as rec:
        plugin_on_path(tmp_path)
    text = " ".join(str(w.message) for w in rec)
    assert "broken" in text and "fp16" in text
    assert "broken" not in F.names() and F.get("fp16").name == "fp16"


@NO_CUDA
@pytest.mark.gpu
@pytest.mark.parametrize("name", BUILTINS)
def test_cuda_matches_cpu_bit_for_bit(name):
    fmt = F.get(name)
    x = _x((3, 16, 256), seed=5) * torch.logspace(-30, 30, 16).reshape(1, 16, 1)
    x[0, 0, 0], x[1, 2, 33], x[2, 5, 100], x[0, 7] = float("nan"), float("inf"), -0.0, 0.0
    x[1, 9, :40] = 1e-40  # fp32 subnormals
    cpu = fmt.encode(x, seed=9, step=4)
    gpu = fmt.encode(x.cuda(), seed=9, step=4)
    assert torch.equal(gpu.codes.cpu(), cpu.codes)
    assert cpu.scales.keys() == gpu.scales.keys()
    for key, s in cpu.scales.items():
        assert torch.equal(gpu.scales[key].cpu().view(torch.uint8), s.view(torch.uint8))
    dg, dc = fmt.decode(gpu).cpu(), fmt.decode(cpu)
    assert torch.equal(torch.isnan(dg), torch.isnan(dc))  # NaN payloads may differ
    assert torch.equal(dg.nan_to_num(0.0).view(torch.int32), dc.nan_to_num(0.0).view(torch.int32))
