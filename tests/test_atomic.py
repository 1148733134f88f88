"""Atomic result files: a finished write replaces the file, a failed one leaves it as it was."""

from __future__ import annotations

import json

import pytest

from precisionlab.atomic import write_json


def test_write_json_replaces_the_file(tmp_path) -> None:
    path = tmp_path / "r.json"
    path.write_text("old")
    write_json(path, {"a": 1.5}, indent=1)
    assert json.loads(path.read_text()) == {"a": 1.5}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_a_failed_write_json_leaves_the_old_file_and_no_temporary(tmp_path) -> None:
    path = tmp_path / "r.json"
    path.write_text("old")
    with pytest.raises(TypeError):
        write_json(path, {"a": object()})
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_json_out_error_names_the_option_for_a_bad_path(tmp_path) -> None:
    from precisionlab.atomic import json_out_error

    assert json_out_error(None) is None
    assert json_out_error(str(tmp_path / "x.json")) is None
    assert "--out takes a .json path" in json_out_error(str(tmp_path / "x.nc"))
    assert json_out_error(str(tmp_path / "no" / "x.json"), "--json").startswith("--json ")
