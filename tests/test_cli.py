"""End-to-end: drive the CLI as a user would (drift -> file -> plot -> gate)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import xarray as xr
from typer.testing import CliRunner

from cli import app

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture(scope="module")
def result_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "tiny.nc"
    r = invoke("drift", "--model", "tiny-mamba2", "--format", "fp8-e4m3", "--format", "nvfp4",
               "--window", "4", "--window", "16", "--steps", "256", "--batch", "2", "--device",
               "cpu", "--out", str(path))
    assert r.exit_code == 0, r.output
    assert "shared" in r.output and "split" in r.output and "growth" in r.output
    assert "B/elt" in r.output and "frontier" in r.output and "± 95%" in r.output
    assert f"wrote {path}" in r.output
    return path


def test_drift_writes_a_self_describing_result(result_file):
    ds = xr.open_dataset(result_file, engine="h5netcdf")
    assert set(ds.dims) == {"design", "format", "window", "step", "head"}
    assert ds.sizes == {"design": 2, "format": 2, "window": 2, "step": 256, "head": 4}
    assert ds.attrs["model"] == "tiny-mamba2" and ds.attrs["batch"] == 2
    assert ds.attrs["command"].startswith("precisionlab drift")
    assert "version_torch" in ds.attrs and "device" in ds.attrs
    assert float(ds["rel_err"].isel(step=-1).min()) > 0


def test_plot_every_kind(result_file, tmp_path):
    for kind, metric in (("curves", "rel_err"), ("window", "rel_err"), ("tradeoff", "rel_err"),
                         ("curves", "rel_err_max"), ("tradeoff", "abs_err_max"),
                         ("heads", "rel_err")):
        png = tmp_path / f"{kind}-{metric}.png"
        r = invoke("plot", str(result_file), "--kind", kind, "--metric", metric, "--out",
                   str(png))
        assert r.exit_code == 0, r.output
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_gate_pass_and_fail(result_file, tmp_path):
    junit = tmp_path / "gate.xml"
    ok = invoke("gate", str(result_file), "--max-rel-err", "10", "--junit", str(junit))
    assert ok.exit_code == 0, ok.output
    assert "8 passed, 0 failed" in ok.output
    assert 'failures="0"' in junit.read_text()
    bad = invoke("gate", str(result_file), "--max-rel-err", "1e-9", "--where", "design=split",
                 "--where", "format=nvfp4")
    assert bad.exit_code == 1
    assert "0 passed, 2 failed" in bad.output and "FAIL" in bad.output


def test_show_prints_a_saved_results_table_and_origin(result_file):
    r = invoke("show", str(result_file))
    assert r.exit_code == 0, r.output
    assert "model: tiny-mamba2" in r.output and "command: precisionlab drift" in r.output
    assert "B/elt" in r.output and r.output.count("│ split ") == 4
    doc = json.loads(invoke("show", str(result_file), "--json").output)
    assert doc["model"] == "tiny-mamba2" and doc["steps"] == 256 and doc["batch"] == 2
    rows = doc["configurations"]
    assert [(c["design"], c["format"], c["window"]) for c in rows][:2] == [
        ("shared", "fp8-e4m3", 4), ("shared", "fp8-e4m3", 16)]
    ds = xr.load_dataset(result_file, engine="h5netcdf")
    from precisionlab.metrics import summarise

    split = next(c for c in rows if c["design"] == "split" and c["format"] == "nvfp4"
                 and c["window"] == 16)
    sel = {"design": "split", "format": "nvfp4", "window": 16}
    assert split["final"] == pytest.approx(float(summarise(ds, "final").sel(sel)), rel=1e-12)
    assert split["bytes_per_step"] == pytest.approx(float(ds["bytes_per_step"].sel(sel)))
    assert any(c["frontier"] for c in rows) and not all(c["frontier"] for c in rows)


def test_show_of_a_compare_result_and_strict_json(tmp_path):
    path = tmp_path / "c.nc"
    assert invoke("compare", "--model", "tiny-gdn", "--format", "nvfp4", "--steps", "3",
                  "--device", "cpu", "--out", str(path)).exit_code == 0
    r = invoke("show", str(path))
    assert r.exit_code == 0 and "shared / split final error" in r.output, r.output
    text = invoke("show", str(path), "--json").output
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert doc["shared_over_split"][0]["format"] == "nvfp4"
    assert doc["configurations"][0]["growth"] is None  # 3 steps: too few to fit a slope


def test_show_of_a_file_that_is_not_a_result_is_one_line_exit_2(tmp_path):
    path = tmp_path / "other.nc"
    xr.Dataset({"t": ("x", [1.0, 2.0])}).to_netcdf(path, engine="h5netcdf")
    r = invoke("show", str(path))
    assert r.exit_code == 2 and r.output.startswith("error: cannot summarise"), r.output
    assert r.output.count("\n") == 1


def test_several_checkpoint_formats(tmp_path):
    path = tmp_path / "ck.nc"
    r = invoke("drift", "--model", "tiny-mamba2", "--format", "nvfp4", "--steps", "32",
               "--checkpoint-format", "fp32", "--checkpoint-format", "fp16-sr", "--device", "cpu",
               "--out", str(path))
    assert r.exit_code == 0, r.output
    assert "split-fp32" in r.output and "split-fp16-sr" in r.output
    ds = xr.load_dataset(path, engine="h5netcdf")
    assert ds["design"].values.tolist() == ["shared", "split-fp32", "split-fp16-sr"]
    assert "--checkpoint-format fp32 --checkpoint-format fp16-sr" in ds.attrs["command"]
    g = invoke("gate", str(path), "--where", "design=split-fp16-sr", "--max-rel-err", "10")
    assert g.exit_code == 0 and "1 passed, 0 failed" in g.output, g.output


def test_gate_another_metric(result_file, tmp_path):
    """--metric picks the per-step variable; its direction decides --max or --min."""
    ds = xr.load_dataset(result_file, engine="h5netcdf")
    ds["top1_agree"] = xr.ones_like(ds["rel_err"])
    path = tmp_path / "m.nc"
    ds.to_netcdf(path, engine="h5netcdf")
    ok = invoke("gate", str(path), "--metric", "top1_agree", "--min", "0.99")
    assert ok.exit_code == 0, ok.output
    assert "top1_agree[final] = 1 (limit 0.99 from below" in ok.output
    bad = invoke("gate", str(path), "--metric", "rel_err_max", "--max", "1e-9")
    assert bad.exit_code == 1 and "rel_err_max[final]" in bad.output
    wrong = invoke("gate", str(path), "--metric", "top1_agree", "--max", "0.5")
    assert wrong.exit_code == 2 and wrong.output.startswith("error: top1_agree: more is better")
    assert wrong.output.count("\n") == 1


def test_gate_against_a_baseline(result_file):
    same = invoke("gate", str(result_file), "--baseline", str(result_file), "--rtol", "0")
    assert same.exit_code == 0, same.output
    at_step = invoke("gate", str(result_file), "--max-rel-err", "1e-3", "--at", "0")
    assert at_step.exit_code == 0, at_step.output  # step 0: fresh state, tiny error


@pytest.mark.parametrize(
    "args, message",
    [
        (["drift", "--model", "no-such-model"], "unknown model"),
        (["drift", "--model", "tiny-gdn", "--format", "fp7"], "unknown format"),
        (["drift", "--model", "tiny-gdn", "--design", "both"], "unknown design"),
        (["drift", "--model", "tiny-gdn", "--window", "0"], "window"),
        (["drift", "--model", "tiny-gdn", "--steps", "0"], "steps must be a positive integer"),
        (["drift", "--model", "tiny-gdn", "--out", "/no/such/dir/r.nc"], "does not exist"),
        (["drift", "--model", "tiny-gdn", "--out", "r.txt"], "cannot tell the file type"),
        (["drift", "--model", "tiny-gdn", "--device", "cuda"], "CUDA"),
        (["gate", "missing.nc", "--max-rel-err", "1"], "not found"),
        (["gate", "RESULT", "--max-rel-err", "1", "--where", "format=mxfp4"], "no format mxfp4"),
        (["gate", "RESULT", "--max-rel-err", "1", "--where", "colour=red"], "--where key"),
        (["gate", "RESULT"], "give a bound"),
        (["gate", "RESULT", "--max-rel-err", "1", "--at", "soon"], "--at must be"),
        (["gate", "RESULT", "--max-rel-err", "-1"], "--max-rel-err must be a finite number"),
        (["gate", "RESULT", "--max-rel-err", "1", "--where", "window=abc"],
         "--where window needs a whole number"),
        (["gate", "RESULT", "--max-rel-err", "nan"], "--max-rel-err must be a finite number"),
        (["drift", "--model", "tiny-gdn", "--checkpoint-format", "fp32", "--checkpoint-format",
          "fp7"], "unknown format"),
        (["compare", "--model", "tiny-gdn", "--steps", "8", "--checkpoint-format", "fp32",
          "--checkpoint-format", "fp16-sr"], "give one checkpoint format"),
        (["gate", "RESULT", "--metric", "kl", "--max", "1"], "no variable 'kl'"),
        (["show", "missing.nc"], "not found"),
        (["plot", "RESULT", "--metric", "kl"], "--metric must be a per-step variable"),
        (["plot", "RESULT", "--metric", "growth", "--kind", "tradeoff"], "per-step variable"),
        (["show", "RESULT.txt"], "cannot tell the file type"),
        (["gate", "RESULT", "--metric", "growth", "--max", "1"], "per-step variable"),
        (["gate", "RESULT", "--metric", "rel_err_max"], "give a bound (--max)"),
        (["gate", "RESULT", "--metric", "rel_err_max", "--max-rel-err", "1"],
         "--max-rel-err bounds rel_err"),
        (["gate", "RESULT", "--baseline", "RESULT", "--rtol", "-0.5"], "--rtol must be"),
        (["plot", "RESULT", "--out", "x.jpg"], "PNG"),
        (["drift", "--model", "tiny-gdn", "--steps", "8", "--plot", "r.nc"], "PNG"),
        (["drift", "--model", "tiny-gdn", "--steps", "8", "--plot", "/no/such/dir/p.png"],
         "folder '/no/such/dir' does not exist"),
        (["window", "--model", "tiny-gdn", "--steps", "8", "--plot", "w.jpg"], "PNG"),
        (["drift", "--model", "tiny-gdn", "--steps", "8", "--batch", "1000000000000"],
         "not enough memory"),
        (["drift", "--level", "model", "--model", "tiny-gdn", "--backend", "triton",
          "--device", "cpu"], "needs a CUDA device"),
        (["drift", "--level", "model", "--model", "tiny-gdn", "--dynamics", "init"],
         "applies to --level layer"),
        (["bench", "--phases", "staggered"], "--phases and --paired apply to the kernel"),
        (["bench", "--what", "gdn", "--phases", "random"], "random"),
        (["bench", "--what", "mamba2", "--phases", "staggered", "--out", "b.nc"], "CUDA"),
        (["bench", "--paired"], "--phases and --paired apply to the kernel benchmarks"),
        (["bench", "--what", "gdn", "--paired", "--model", "nemotron-3-nano-4b"],
         "is a mamba2 model, not gdn"),
        (["bench", "--what", "gdn", "--paired", "--batch", "1", "--batch", "4"],
         "one model, one batch and one window"),
        (["bench", "--what", "gdn", "--paired", "--rounds", "1"], "rounds >= 2"),
        (["bench", "--what", "mamba2", "--paired", "--phases", "staggered"], "aligned"),
        (["bench", "--what", "mamba2", "--paired", "--out", "p.json"], "CUDA"),
        (["bench", "--what", "gdn", "--rounds", "5"], "--rounds applies to --paired"),
        (["bench", "--what", "gdn", "--layers", "4"], "--layers applies to --paired"),
        (["bench", "--what", "gdn", "--paired", "--layers", "0"],
         "layers must be an integer >= 1"),
        (["bench", "--what", "mamba2", "--paired", "--layers", "0"],
         "layers must be an integer >= 1"),
        (["bench", "--what", "gdn", "--mamba-ssm-path", "."], "applies to --what mamba2"),
        (["bench", "--what", "mamba2", "--mamba-ssm-path", "no/such/dir"], "is not a folder"),
        (["bench", "--steps", "0"], "steps must be an integer >= 1"),
        (["bench", "--batch", "0"], "batch must be an integer >= 1"),
        (["bench", "--steps", "1", "--out", "b.txt"], "use one of .nc, .zarr, .json"),
        (["bench", "--steps", "1", "--out", "/no/such/dir/b.json"], "does not exist"),
        (["bench", "--steps", "1", "--out", "/no/such/dir/b.nc"], "does not exist"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, result_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    gpu_check = "cuda" in args or args[:3] == ["bench", "--what", "mamba2"]
    if gpu_check:
        pytest.importorskip("torch")
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is present")
    args = [str(result_file) if a == "RESULT" else a.replace("RESULT", str(result_file))
            for a in args]
    r = invoke(*args)
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert "Traceback" not in r.output
    if not r.output.startswith("Usage: "):  # the option parser's own box, else ours
        assert r.output.startswith("error: ") and r.output.count("\n") == 1, repr(r.output)
    assert not list(tmp_path.iterdir()), "no partial files"


@pytest.mark.parametrize("name, make", [("r.zarr", "file"), ("r.nc", "folder")])
def test_an_output_path_of_the_wrong_kind_is_refused_before_the_run(tmp_path, name, make):
    """A zarr result is a folder, a netCDF or CSV result a file: a path already taken
    by the other kind is refused up front and left as it was."""
    target = tmp_path / name
    if make == "file":
        target.write_text("keep")
    else:
        target.mkdir()
    r = invoke("drift", "--model", "tiny-gdn", "--steps", "8", "--out", str(target))
    assert r.exit_code == 2, r.output
    assert "cannot write" in r.output and "Traceback" not in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    assert target.read_text() == "keep" if make == "file" else not list(target.iterdir())


def test_gate_report_never_overwrites_the_result(result_file, tmp_path):
    before = result_file.read_bytes()
    for extra in ([], ["--baseline", str(result_file)]):
        r = invoke("gate", str(result_file), "--max-rel-err", "1", *extra,
                   "--junit", str(result_file))
        assert r.exit_code == 2 and "would overwrite" in r.output, r.output
    base = tmp_path / "base.nc"
    base.write_bytes(before)
    r = invoke("gate", str(result_file), "--baseline", str(base), "--junit", str(base))
    assert r.exit_code == 2 and "would overwrite" in r.output, r.output
    assert result_file.read_bytes() == before and base.read_bytes() == before


def test_unreadable_result_is_a_usage_error(tmp_path):
    junk = tmp_path / "junk.nc"
    junk.write_text("not netcdf")
    r = invoke("gate", str(junk), "--max-rel-err", "1")
    assert r.exit_code == 2 and "cannot read result" in r.output


def test_formats_and_models_listings():
    r = invoke("formats", "--json")
    assert r.exit_code == 0
    rows = json.loads(r.output)
    assert [row["name"] for row in rows][:10] == [
        "fp32", "bf16", "fp16", "bf16-sr", "fp16-sr", "fp8-e4m3", "fp8-e5m2", "mxfp8", "nvfp4",
        "mxfp4"]
    nvfp4 = next(row for row in rows if row["name"] == "nvfp4")
    assert 4.5 <= nvfp4["bits_per_element"] < 4.51
    m = invoke("models", "--json")
    assert m.exit_code == 0
    assert any(p["name"] == "qwen3.5-4b" and p["kind"] == "gdn" for p in json.loads(m.output))
    assert invoke("models").exit_code == 0 and invoke("formats").exit_code == 0


def test_trace_save_then_drift_replays_it(tmp_path):
    trace = tmp_path / "t.safetensors"
    r = invoke("trace", "save", "--model", "tiny-gdn", "--steps", "40", "--out", str(trace))
    assert r.exit_code == 0, r.output
    info = invoke("trace", "info", str(trace))
    assert info.exit_code == 0 and "40 steps" in info.output
    out = tmp_path / "r.csv"
    d = invoke("drift", "--model", str(trace), "--format", "fp8-e4m3", "--window", "8",
               "--device", "cpu", "--out", str(out))
    assert d.exit_code == 0, d.output
    assert xr.load_dataset  # noqa: B018 - import is used below
    from precisionlab.export import load_result

    assert load_result(out).sizes["step"] == 40


def test_compare_and_window_studies(tmp_path):
    r = invoke("compare", "--model", "tiny-gdn", "--format", "fp8-e4m3", "--steps", "64",
               "--device", "cpu", "--out", str(tmp_path / "c.nc"))
    assert r.exit_code == 0, r.output and "shared / split" in r.output
    w = invoke("window", "--model", "tiny-mamba2", "--format", "fp8-e4m3", "-L", "1", "-L", "8",
               "--steps", "64", "--device", "cpu", "--out", str(tmp_path / "w.zarr"),
               "--plot", str(tmp_path / "w.png"))
    assert w.exit_code == 0, w.output
    assert (tmp_path / "w.zarr").is_dir() and (tmp_path / "w.png").is_file()


def test_console_script_runs():
    r = subprocess.run([sys.executable, "-m", "precisionlab.cli", "models", "--json"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert "nemotron-3-nano-4b" in r.stdout
    bad = subprocess.run([sys.executable, "-m", "precisionlab.cli", "drift", "--model", "x"],
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "unknown model" in bad.stderr and "Traceback" not in bad.stderr


def test_model_level_drift_and_capture(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "m.nc"
    r = invoke("drift", "--level", "model", "--model", "tiny-mamba2", "--format", "nvfp4",
               "-L", "4", "--steps", "12", "--batch", "1", "--device", "cpu", "--out", str(out))
    assert r.exit_code == 0, r.output
    assert "top-1 agree" in r.output and "first divergence" in r.output
    from precisionlab.export import load_result

    ds = load_result(out)
    assert {"kl", "top1_agree", "dlogp_mean", "dlogp_p95"} <= set(ds.data_vars)
    assert "synthetic weights" in ds.attrs["weights"]
    base = tmp_path / "cap.safetensors"
    c = invoke("trace", "capture", "--model", "tiny-gdn", "--steps", "10", "--out", str(base),
               "--batch", "1", "--device", "cpu")
    assert c.exit_code == 0, c.output
    written = sorted(tmp_path.glob("cap.L*.safetensors"))
    assert written, c.output
    d = invoke("drift", "--model", str(written[0]), "--format", "fp8-e4m3", "-L", "4",
               "--device", "cpu", "--out", str(tmp_path / "replay.csv"))
    assert d.exit_code == 0, d.output
    bad = invoke("drift", "--level", "model", "--model", str(tmp_path / "no-such-ckpt"))
    assert bad.exit_code == 2 and "Traceback" not in bad.output


def test_tradeoff_plot_of_a_result_it_cannot_model_is_one_line_exit_2(result_file, tmp_path):
    """A result whose format this installation does not know (a plug-in's, say) and
    that carries no traffic of its own cannot be placed on the traffic axis."""
    ds = xr.load_dataset(result_file, engine="h5netcdf").drop_vars("bytes_per_step")
    odd = tmp_path / "odd.nc"
    ds.assign_coords(format=["fp8-e4m3", "no-such-format"]).to_netcdf(odd, engine="h5netcdf")
    png = tmp_path / "t.png"
    r = invoke("plot", str(odd), "--kind", "tradeoff", "--out", str(png))
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: cannot model the traffic") and r.output.count("\n") == 1
    assert not png.exists()
