"""Bad input to every command: one line, exit 2, nothing half-written and nothing of
the user's replaced (found by a sweep of garbage arguments)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from precisionlab.atomic import atomic_path
from precisionlab.export import load_result

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def one_line_error(r, message: str) -> None:
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.output.startswith("error: ") and r.output.count("\n") == 1, repr(r.output)
    assert message in r.output, r.output


@pytest.fixture(scope="module")
def result_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("robust") / "r.nc"
    r = invoke("drift", "--model", "tiny-gdn", "--format", "nvfp4", "-L", "4", "-L", "8",
               "--steps", "32", "--batch", "2", "--device", "cpu", "--out", str(path))
    assert r.exit_code == 0, r.output
    return path


@pytest.mark.parametrize("at", ["--3", "³", "٣"])
@pytest.mark.parametrize("command", ["gate", "advise"])
def test_at_that_is_not_an_ascii_step_index(result_file, command, at):
    """str.isdigit() holds for '³' and '٣': int() then raised (a traceback) or read a
    step the user never wrote."""
    args = [str(result_file)] if command == "gate" else ["--from", str(result_file)]
    one_line_error(invoke(command, *args, "--max", "1", "--at", at), "--at must be")


def test_where_window_that_is_not_an_ascii_number(result_file):
    r = invoke("gate", str(result_file), "--max", "1", "--where", "window=³")
    one_line_error(r, "--where window needs a whole number, got '³'")


def test_a_baseline_without_the_configuration_names_it_plainly(result_file, tmp_path):
    other = tmp_path / "other.nc"
    assert invoke("drift", "--model", "tiny-gdn", "--format", "fp8-e4m3", "-L", "4", "--steps",
                  "8", "--device", "cpu", "--out", str(other)).exit_code == 0
    r = invoke("gate", str(result_file), "--max", "1", "--baseline", str(other))
    one_line_error(r, "the baseline has no configuration design=shared format=nvfp4 window=4")
    assert "np.str_" not in r.output


@pytest.mark.parametrize("args", [
    ["plot", "RESULT", "--out", "DIR"],
    ["gate", "RESULT", "--max", "1", "--junit", "DIR"],
    ["advise", "--from", "RESULT", "--max", "1", "--plot", "DIR"],
    ["drift", "--model", "tiny-gdn", "--steps", "4", "--device", "cpu", "--out", "r.nc",
     "--plot", "DIR"],
    ["trace", "save", "--model", "tiny-gdn", "--steps", "4", "--out", "DIR"],
])
def test_an_output_path_that_is_a_folder_is_refused_and_kept(result_file, tmp_path, args,
                                                              monkeypatch):
    """The atomic rename replaced the folder, contents and all, with the figure, the
    report or the trace."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / ("keep.safetensors" if "trace" in args else "keep.png")
    folder.mkdir()
    (folder / "precious.txt").write_text("keep")
    r = invoke(*[str(result_file) if a == "RESULT" else str(folder) if a == "DIR" else a
                 for a in args])
    one_line_error(r, "it is a folder")
    assert (folder / "precious.txt").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder.name]


def test_atomic_write_never_replaces_a_folder_with_a_file(tmp_path):
    folder = tmp_path / "out.png"
    folder.mkdir()
    (folder / "precious.txt").write_text("keep")
    with pytest.raises(IsADirectoryError), atomic_path(folder) as tmp:
        tmp.write_text("figure")
    assert (folder / "precious.txt").read_text() == "keep"
    assert [p.name for p in tmp_path.iterdir()] == ["out.png"]


def test_advice_on_a_netcdf_result_written_as_csv(result_file, tmp_path):
    """Attributes read back from netCDF are numpy numbers: the CSV header's json.dumps
    raised after the table was printed."""
    out = tmp_path / "a.csv"
    r = invoke("advise", "--from", str(result_file), "--max", "1", "--out", str(out))
    assert r.exit_code == 0, r.output
    ds = load_result(out)
    assert ds.attrs["steps"] == 32 and ds.attrs["advice_metric"] == "rel_err"


@pytest.mark.parametrize("command", ["drift", "compare", "window"])
@pytest.mark.parametrize("seed", ["99999999999999999999", str(2**64 - 1), str(-(2**63) - 1)])
def test_a_seed_past_64_bits(command, seed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = invoke(command, "--model", "tiny-gdn", "--format", "nvfp4", "-L", "4", "--steps", "4",
               "--device", "cpu", "--seed", seed)
    one_line_error(r, "seed must be an integer from -2**63 to 2**64 - 2")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args", [
    ["drift", "--model", "tiny-gdn", "--format", "nvfp4", "-L", "4", "--device", "cpu",
     "--steps", "99999999999999999999"],
    ["drift", "--model", "tiny-gdn", "--format", "nvfp4", "-L", "4", "--device", "cpu",
     "--steps", "4", "--batch", str(2**62)],
    ["bench", "--model", "tiny-gdn", "--steps", "1", "--batch", str(2**62)],
    ["bench", "--model", "tiny-gdn", "--steps", "1", "--batch", "99999999999999999999"],
])
def test_sizes_too_large_to_allocate_at_all(args, tmp_path, monkeypatch):
    """numpy and torch refuse such sizes with ValueError / TypeError / RuntimeError,
    not MemoryError."""
    monkeypatch.chdir(tmp_path)
    one_line_error(invoke(*args), "not enough memory for this run")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("steps", [10**12, 2**62, 10**20])
def test_trace_save_too_large_for_the_memory_fails_at_once(steps, tmp_path, monkeypatch):
    """The steps were gathered one by one until the machine ran out of memory (the
    process was killed minutes later); now the trace is allocated whole at its first
    step (a trace read further than that fails here at once instead)."""
    from precisionlab.traces import SyntheticTrace

    read = SyntheticTrace.__iter__

    def first_step_only(self):
        yield next(read(self))
        raise AssertionError("the trace was read past its first step")

    monkeypatch.setattr(SyntheticTrace, "__iter__", first_step_only)
    out = tmp_path / "t.safetensors"
    r = invoke("trace", "save", "--model", "tiny-gdn", "--steps", str(steps), "--out",
               str(out))
    one_line_error(r, "not enough memory for this run")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args, message", [
    (["--out", "b.csv"], "use one of .nc, .zarr, .json"),
    (["--window", "4"], "--window applies to the kernel benchmarks"),
    (["--model", "tiny-mamba2"], "--what engine times one model at one batch"),
    (["--batch", "1", "--batch", "2"], "--what engine times one model at one batch"),
])
def test_engine_bench_options_that_cannot_apply(args, message, tmp_path, monkeypatch):
    """A CSV result is tidy rows per decode step (a benchmark's failed to write after
    the run); the engine benchmark times one model and batch and no window (the rest
    were dropped without a word)."""
    monkeypatch.chdir(tmp_path)
    one_line_error(invoke("bench", "--model", "tiny-gdn", "--steps", "1", *args), message)
    assert not list(tmp_path.iterdir())


def test_a_window_longer_than_the_run_is_noted_in_one_line(tmp_path, monkeypatch):
    """The command line says once, as a note on standard error, that a window longer
    than the run never flushed; the result and `show` keep the note."""
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["drift", "--model", "tiny-gdn", "--steps", "8", "--window",
                                 "16", "--format", "nvfp4", "--out", "r.nc"])
    assert r.exit_code == 0, r.output
    notes = [line for line in r.output.splitlines() if line.startswith("note:")]
    assert notes == ["note: window 16 is longer than the 8 steps: its designs never flushed, so "
                     "their stored state was never rounded and their error does not measure the "
                     "format (raise --steps)"]
    assert "Warning" not in r.output
    shown = CliRunner().invoke(app, ["show", "r.nc"])
    assert "notes: window 16 is longer" in shown.output


def test_show_markdown_is_the_summary_as_a_markdown_table(tmp_path, monkeypatch):
    """`show --markdown` prints the same cells as the table, as Markdown rows; with
    --json it is a usage error."""
    from precisionlab.commands.common import summary_cells

    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["compare", "--model", "tiny-gdn", "--steps", "8", "--window", "4",
                            "--format", "nvfp4", "--out", "c.nc"])
    assert r.exit_code == 0, r.output
    md = runner.invoke(app, ["show", "c.nc", "--markdown"])
    assert md.exit_code == 0, md.output
    lines = md.output.splitlines()
    cols, rows = summary_cells(load_result("c.nc"))
    assert "| " + " | ".join(cols) + " |" in lines
    for cells in rows:
        assert "| " + " | ".join(cells) + " |" in lines
    assert any(line.startswith("| nvfp4 | 4 | ") for line in lines)  # the shared/split ratio
    both = runner.invoke(app, ["show", "c.nc", "--markdown", "--json"])
    assert both.exit_code == 2 and "not both" in both.output


def test_a_recorded_command_runs_again(tmp_path, monkeypatch):
    """The command a result records runs as it is: on/off flags appear bare when on and
    not at all when off (never as '--json False')."""
    import shlex

    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["advise", "--model", "tiny-gdn", "--steps", "8", "--window", "2",
                            "--format", "nvfp4", "--max", "0.5", "--confident", "--out", "a.nc"])
    assert r.exit_code in (0, 1), r.output
    command = str(load_result("a.nc").attrs["command"])
    words = shlex.split(command)
    assert "--confident" in words and "--json" not in words and "False" not in words
    again = runner.invoke(app, [*words[1:-2], "--out", "b.nc"])  # the same, another file
    assert again.exit_code == r.exit_code, again.output
    assert load_result("b.nc").attrs["command"] == command.replace("a.nc", "b.nc")


def test_capture_into_a_missing_folder_fails_before_loading_a_model(tmp_path):
    """The folder is checked before transformers (and whatever it imports) loads, so the
    error is the only line, in a fresh process too."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "precisionlab.cli", "trace", "capture", "--model",
                        "tiny-gdn", "--steps", "4", "--out", str(tmp_path / "no" / "c.safetensors"),
                        "--device", "cpu"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        f"error: cannot write {str(tmp_path / 'no' / 'c.safetensors')!r}: folder "
        f"{str(tmp_path / 'no')!r} does not exist"]


def _no_temp_left(folder: Path) -> None:
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []


def test_an_output_folder_on_a_read_only_file_system_is_refused_before_the_run(
        tmp_path, monkeypatch):
    """Permission bits say nothing of a read-only mount (nor to root): the check tries
    what the write will do first, and the run does not start."""
    import errno
    import tempfile

    from precisionlab import atomic, engine

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(atomic.tempfile, "mkdtemp", read_only)
    ran: list[int] = []
    monkeypatch.setattr(engine, "run", lambda *a, **k: ran.append(1) or iter(()))
    r = invoke("drift", "--model", "tiny-gdn", "--steps", "8", "--out", "r.nc")
    one_line_error(r, "cannot write 'r.nc': folder '.' is not writable (Read-only file system)")
    assert ran == [] and not (tmp_path / "r.nc").exists()
    monkeypatch.setattr(atomic.tempfile, "mkdtemp", tempfile.mkdtemp)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_output_in_proc_is_refused_in_one_line():
    r = invoke("drift", "--model", "tiny-gdn", "--steps", "8", "--out", "/proc/r.nc")
    one_line_error(r, "cannot write '/proc/r.nc': folder '/proc' is not writable")
    assert "No such file" not in r.output, "the probe's errno says nothing to the user"


def test_a_write_that_fails_after_the_run_is_one_line_and_leaves_no_file(tmp_path,
                                                                        monkeypatch):
    """A full disk at the end of a run: one line, exit 1, no partial file."""
    import errno

    import xarray as xr

    def disk_full(self, path, *args, **kwargs):
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(xr.Dataset, "to_netcdf", disk_full)
    r = invoke("drift", "--model", "tiny-gdn", "--steps", "8", "--out", "r.nc")
    assert r.exit_code == 1, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.output.splitlines()[-1] == "error: cannot write 'r.nc': No space left on device"
    assert "Traceback" not in r.output
    assert not (tmp_path / "r.nc").exists()
    _no_temp_left(tmp_path)
