"""read_parquet over files whose schema changes mid-listing (issue 32 item 8): each file is
checked against the spec's ``schema`` or the first file's, and a file that differs is a
SampleError naming the file and the column, or (``on_error: skip``) a counted skip, with exact
resume either way."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conveyor import SpecErrors, load_graph
from conveyor.errors import SampleError
from conveyor.nodes import ListFiles
from conveyor.nodes.read_parquet import ReadParquet


def _write(folder: Path, name: str, **columns) -> None:
    pq.write_table(pa.table(columns), folder / name, row_group_size=2)


def _good(folder: Path, name: str, start: int) -> None:
    _write(folder, name, id=list(range(start, start + 3)), text=[f"t{i}" for i in range(start, start + 3)])


def _rows(folder: Path, **kw) -> list[dict]:
    return list(ReadParquet(ListFiles(url=str(folder / "*.parquet")), **kw))


@pytest.mark.parametrize("changed, words", [
    ({"id": [3.0, 4.0], "text": ["a", "b"]}, r"column 'id' is double, where the first file \(.*a\.parquet\) has int64"),
    ({"id": ["3", "4"], "text": ["a", "b"]}, r"column 'id' is string, where the first file \(.*a\.parquet\) has int64"),
    ({"text": ["a", "b"]}, r"no column 'id', which the first file \(.*a\.parquet\) has as int64"),
    ({"id": [3, 4], "text": ["a", "b"], "extra": [1, 2]}, r"column 'extra' is not in the first file"),
])
def test_a_file_whose_schema_changed_is_named_with_the_column(tmp_path: Path, changed, words) -> None:
    _good(tmp_path, "a.parquet", 0)
    _write(tmp_path, "b.parquet", **changed)
    with pytest.raises(SampleError, match=r"read_parquet: .*b\.parquet: " + words):
        _rows(tmp_path)


def test_an_extra_column_is_fine_when_columns_leaves_it_out(tmp_path: Path) -> None:
    _good(tmp_path, "a.parquet", 0)
    _write(tmp_path, "b.parquet", id=[3, 4], text=["a", "b"], extra=[1.5, 2.5])
    assert [r["id"] for r in _rows(tmp_path, columns=["id", "text"])] == [0, 1, 2, 3, 4]
    _write(tmp_path, "c.parquet", id=[5.0], text=["c"])  # but a column read still has to match
    with pytest.raises(SampleError, match=r"c\.parquet: column 'id' is double"):
        _rows(tmp_path, columns=["id"])


def test_a_file_of_nulls_only_goes_with_any_type(tmp_path: Path) -> None:
    _good(tmp_path, "a.parquet", 0)
    _write(tmp_path, "b.parquet", id=pa.array([None, None], pa.null()), text=["a", "b"])
    assert [r["id"] for r in _rows(tmp_path)] == [0, 1, 2, None, None]


def test_a_changed_file_is_skipped_and_counted_in_the_ledger(tmp_path: Path, write_spec) -> None:
    _good(tmp_path, "a.parquet", 0)
    _write(tmp_path, "b.parquet", id=[3.0, 4.0], text=["a", "b"])
    _good(tmp_path, "c.parquet", 10)
    spec = write_spec(f"""
nodes:
  files: {{op: list_files, url: "{tmp_path}/*.parquet"}}
  rows:  {{op: read_parquet, on_error: skip}}
""")
    with load_graph(spec) as loader:
        ids = [r["id"] for r in loader]
        ledger = loader.skipped()
    assert ids == [0, 1, 2, 10, 11, 12]
    assert ledger["count"] == 1 and "b.parquet" in json.dumps(ledger["entries"])
    assert "column 'id' is double" in json.dumps(ledger["entries"])


def test_the_specs_schema_is_checked_from_the_first_file(tmp_path: Path, write_spec) -> None:
    _write(tmp_path, "a.parquet", id=[0.5, 1.5], text=["a", "b"])
    spec = write_spec(f"""
nodes:
  files: {{op: list_files, url: "{tmp_path}/*.parquet"}}
  rows:  {{op: read_parquet, schema: {{id: int64, text: string}}}}
""")
    with load_graph(spec) as loader, pytest.raises(SampleError, match=r"a\.parquet: column 'id' is double, where "
                                                                       r"the spec's schema has int64"):
        list(loader)
    _write(tmp_path, "a.parquet", id=[0, 1], text=["a", "b"])
    with load_graph(spec) as loader:
        assert [r["id"] for r in loader] == [0, 1]


def test_an_unknown_type_in_the_schema_is_a_spec_error(write_spec, tmp_path: Path) -> None:
    spec = write_spec(f"""
nodes:
  files: {{op: list_files, url: "{tmp_path}/*.parquet"}}
  rows:  {{op: read_parquet, schema: {{id: integer}}}}
""")
    with pytest.raises(SpecErrors) as info:
        load_graph(spec)
    (err,) = info.value.errors
    assert err.param == "schema" and "'integer' is not a pyarrow type name" in err.message


def test_a_restore_checks_against_the_same_schema(tmp_path: Path, write_spec) -> None:
    """The first file's schema is in the state: restored in the middle of a file of nulls only
    (whose schema is no guide), a later file of another type is still skipped."""
    _good(tmp_path, "a.parquet", 0)
    _write(tmp_path, "b.parquet", id=pa.array([None] * 4, pa.null()), text=["n"] * 4)
    _write(tmp_path, "c.parquet", id=[7.5, 8.5], text=["x", "y"])
    spec = write_spec(f"""
nodes:
  files: {{op: list_files, url: "{tmp_path}/*.parquet"}}
  rows:  {{op: read_parquet, on_error: skip, batch_rows: 1}}
""")
    with load_graph(spec) as loader:
        full, states = [], []
        for r in loader:
            full.append(r["id"])
            states.append(json.loads(json.dumps(loader.state_dict())))
    assert full == [0, 1, 2, None, None, None, None]
    for k, state in enumerate(states[:-1]):  # (the last state resumes at the next epoch)
        with load_graph(spec) as again:
            again.load_state_dict(state)
            assert [r["id"] for r in again] == full[k + 1:], f"resumed after row {k}"
            assert again.skipped()["count"] == 1
