"""Tests for the text path: read_jsonl (provenance, bad lines, mid-file resume by byte
offset, fsspec URLs), the tokenizers, pad_collate (properties), and specs/text.yaml end to end
with an exact resume from every step of two epochs."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchdata.nodes import BaseNode, IterableWrapper

from conveyor import SampleError, SpecErrors, check_spec, load_graph
from conveyor.nodes.bucket_batch import BucketBatch
from conveyor.nodes.list_files import ListFiles
from conveyor.nodes.map import Map
from conveyor.nodes.pad_collate import PadCollate, pad_collate
from conveyor.nodes.read_jsonl import ReadJsonl
from conveyor.text import byte_tokenize, load_vocab, vocab_tokenize
from conveyor.graphs.state import rank_states
from resume_check import check_resume, run_with_states

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "specs" / "text.yaml"
SAMPLE = ROOT / "examples" / "data" / "text-sample"


def _write_jsonl(path: Path, texts: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path


def _corpus(tmp_path: Path, files: int = 3, per_file: int = 40, seed: int = 0) -> Path:
    rng = random.Random(seed)
    words = "the of data loader batch token pad bucket shard epoch resume state".split()
    for i in range(files):
        texts = [" ".join(rng.choice(words) for _ in range(max(1, int(rng.paretovariate(1.3) * 4))))[:900]
                 for _ in range(per_file)]
        _write_jsonl(tmp_path / f"part-{i}.jsonl", texts)
    return tmp_path


def _reader(url: str, **kw: Any) -> ReadJsonl:
    return ReadJsonl(ListFiles(url=url), **kw)


def _drain(node: BaseNode, state: dict | None = None) -> list:
    node.reset(state)
    return list(node)


# ----- read_jsonl ---------------------------------------------------------------------------


def test_read_jsonl_records_with_provenance(tmp_path):
    _write_jsonl(tmp_path / "a" / "x.jsonl", ["one", "two"])
    _write_jsonl(tmp_path / "b" / "y.jsonl", ["three"])
    node = ReadJsonl(ListFiles(url=f"{tmp_path}/*/*.jsonl", label="parent_dir"))
    out = _drain(node)
    assert [r["text"] for r in out] == ["one", "two", "three"]
    assert [r["line"] for r in out] == [1, 2, 1]
    assert [r["label"] for r in out] == [0, 0, 1]
    assert [r["index"] for r in out] == [0, 1, 1 << 32]
    assert out[2]["file"].endswith("b/y.jsonl")


def test_read_lines_format(tmp_path):
    (tmp_path / "t.txt").write_text("alpha\nbeta\r\ngamma")
    out = _drain(_reader(f"{tmp_path}/*.txt", format="lines"))
    assert [r["text"] for r in out] == ["alpha", "beta", "gamma"]


def test_read_jsonl_from_fsspec_url_and_gzip(tmp_path):
    fs = fsspec.filesystem("memory")
    with fs.open("/conveyor-test/a.jsonl", "w") as f:
        f.write('{"text": "in memory"}\n{"text": "second"}\n')
    out = _drain(_reader("memory://conveyor-test/*.jsonl"))
    assert [r["text"] for r in out] == ["in memory", "second"]
    assert out[0]["file"].startswith("memory://") and out[0]["line"] == 1
    with gzip.open(tmp_path / "z.jsonl.gz", "wt") as f:
        f.write('{"text": "zipped"}\n')
    assert [r["text"] for r in _drain(_reader(f"{tmp_path}/*.gz"))] == ["zipped"]


@pytest.mark.parametrize("line, why", [
    ("not json", "not JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    ('{"other": 1}', "no field 'text'"),
    ('{"content": "Return the length", "id": 7}', r"no field 'text' \(it has: content, id; the field param "),
    ('{"text": "   "}', "field 'text' is empty"),
    ('{"text": 5}', "field 'text' is int"),
    ('{"text": null}', "field 'text' is null"),  # it said "no field 'text'", which it has
])
def test_bad_lines_name_file_and_line_or_are_counted(tmp_path, line, why):
    path = tmp_path / "bad.jsonl"
    path.write_text(f'{{"text": "ok"}}\n{line}\n{{"text": "fine"}}\n')
    with pytest.raises(SampleError, match=rf"bad\.jsonl:2: {why}"):
        _drain(_reader(str(path)))
    node = _reader(str(path), on_error="skip")
    assert [r["text"] for r in _drain(node)] == ["ok", "fine"]
    assert node.stats()["skipped"] == 1


def test_a_bad_line_or_file_names_the_reading_node_in_python_and_in_the_cli(tmp_path, write_spec, capsys):
    from conveyor.tools import cli
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": "cut\n{"text": "fine"}\n', encoding="utf-8")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not parquet at all")
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "ok.parquet")
    cases = [("jsonl", "read_jsonl", "bad.jsonl:2: not JSON"),
             ("parquet", "read_parquet", "bad.parquet: cannot read it as Parquet"),
             ("parquet", "read_parquet", "ok.parquet: no column 'text'")]
    for ext, op, message in cases:
        columns = ", columns: [text]" if "column" in message else ""
        glob = message.split(":")[0] if ext == "parquet" else f"*.{ext}"
        spec = write_spec(f"""
nodes:
  files: {{op: list_files, url: "{tmp_path}/{glob}"}}
  read:  {{op: {op}{columns}}}
""")
        # the error said which file and line, but not which node of the graph read it
        with load_graph(spec) as loader, pytest.raises(SampleError, match=message) as err:
            list(loader)
        assert err.value.__notes__ == [f"in node 'read' ({op}) from {spec}:4"]
        assert cli.main(["run", str(spec), "-q"]) == 1
        printed = capsys.readouterr().err
        assert message in printed and f"in node 'read' ({op}) from {spec}:4" in printed, printed


@pytest.mark.parametrize("fmt", ["jsonl", "lines"])
def test_blank_lines_and_a_byte_order_mark_hold_no_record(tmp_path, fmt):
    path = tmp_path / "windows.jsonl"
    first, second = ('{"text": "é first"}', '{"text": "second"}') if fmt == "jsonl" else ("é first", "second")
    path.write_bytes(b"\xef\xbb\xbf" + f"{first}\r\n\r\n   \t\n{second}\r\n\n".encode())
    node = _reader(str(path), format=fmt)
    got = [(r["text"], r["line"], r["index"]) for r in _drain(node)]
    assert got == [("é first", 1, 0), ("second", 4, 3)]  # nothing raised, nothing counted
    assert node.stats()["skipped"] == 0


def test_an_encoding_lines_cannot_be_cut_in_is_refused_before_reading(tmp_path, write_spec):
    rows = '{"text": "Größe"}\n{"text": "Maß"}\n'
    for enc in ("utf-16", "latin-1", "utf-8-sig"):
        (tmp_path / f"{enc}.jsonl").write_text(rows, encoding=enc)
    for enc in ("latin-1", "utf-8-sig"):
        assert [r["text"] for r in _drain(_reader(str(tmp_path / f"{enc}.jsonl"), encoding=enc))] == ["Größe", "Maß"]
    # utf-16 read its first line and called the second "not utf-16 text"; an unknown name was a
    # LookupError at the first line
    for enc, why in (("utf-16", "does not read ASCII bytes as ASCII text"), ("utf-32-le", "does not read ASCII"),
                     ("no-such-codec", "unknown encoding 'no-such-codec'"), ("rot13", "does not read ASCII")):
        with pytest.raises(ValueError, match=why):
            _reader(str(tmp_path / "utf-16.jsonl"), encoding=enc)
        spec = write_spec(f"""
nodes:
  files: {{op: list_files, url: "{tmp_path}/utf-16.jsonl"}}
  read:  {{op: read_jsonl, encoding: {enc}}}
""")
        with pytest.raises(SpecErrors) as info:
            check_spec(spec)
        (err,) = info.value.errors
        assert (err.node, err.param, err.line) == ("read", "encoding", 4) and why in err.message


def test_not_utf8_is_a_bad_line(tmp_path):
    path = tmp_path / "bin.jsonl"
    path.write_bytes(b'{"text": "a"}\n\xff\xfe\n')
    with pytest.raises(SampleError, match=r"bin\.jsonl:2: not utf-8"):
        _drain(_reader(str(path)))


def _prose() -> list[str]:
    """Real prose: the docstrings of some standard-library modules and their members, and lines
    in many scripts (CJK, RTL, emoji with ZWJ and skin tones, combining accents, NFC and NFD)."""
    import importlib
    import inspect
    import unicodedata

    docs: list[str] = []
    for name in ("json", "collections", "os", "re", "argparse", "itertools", "functools", "pathlib",
                 "logging", "decimal", "datetime", "email.message", "http.client", "unittest"):
        module = importlib.import_module(name)
        for _, obj in [(name, module)] + inspect.getmembers(module):
            doc = inspect.getdoc(obj)
            if doc and doc not in docs:
                docs.append(doc)
    docs += ["日本語のテキスト、句読点。漢字とかな", "中文文本：你好，世界！", "한국어 문장입니다.",
             "مرحبا بالعالم، هذا نص عربي", "שלום עולם, זה טקסט בעברית", "👨‍👩‍👧‍👦 family 👍🏽 🏳️‍🌈",
             unicodedata.normalize("NFC", "café naïve résumé"), unicodedata.normalize("NFD", "café naïve résumé"),
             "e\u0301\u0301\u0301 stacked accents", "tab\there\r\nCRLF inside", "nul\x00byte"]
    return docs


def _prose_jsonl(size: int) -> bytes:
    """At least ``size`` bytes of JSONL records of ``_prose()``, repeated as needed."""
    lines = [json.dumps({"text": t}, ensure_ascii=False).encode() + b"\n" for t in _prose()]
    out = bytearray()
    while len(out) < size:
        out += b"".join(lines)
    return bytes(out)


def test_a_truncated_or_corrupt_compressed_file_names_the_file_and_line_or_skips_its_rest(tmp_path, monkeypatch):
    import bz2
    import lzma

    from conveyor.nodes import read_jsonl

    monkeypatch.setattr(read_jsonl, "BLOCK", 1 << 16)  # several read blocks: the cut falls after some records
    data = _prose_jsonl(1)
    n_lines = data.count(b"\n")
    for suffix, compress in ((".gz", gzip.compress), (".bz2", lambda d: bz2.compress(d, 1)), (".xz", lzma.compress)):
        blob = compress(data)  # (bz2 in its 100 kB blocks, so some come whole before the cut)
        path = tmp_path / f"cut.jsonl{suffix}"
        path.write_bytes(blob[: len(blob) * 3 // 4])  # a download cut short
        with pytest.raises(SampleError, match=rf"cut\.jsonl\{suffix}: cannot read it after line \d+ "
                                              r"\(EOFError") as err:  # was a bare EOFError
            _drain(_reader(str(path)))
        assert "in read_jsonl" in err.value.__notes__
        node = _reader(str(path), on_error="skip")
        out = _drain(node)
        assert 0 < len(out) < n_lines and [r["line"] for r in out] == list(range(1, len(out) + 1))
        assert node.stats()["skipped"] == 1  # the rest of the file, counted
        assert f"cut.jsonl{suffix}:{len(out) + 1}" in str(node.ledger.state())
    broken = bytearray(gzip.compress(data))
    broken[-8] ^= 0xFF  # its CRC: the data decode, then the check at the end fails
    (tmp_path / "bad.jsonl.gz").write_bytes(bytes(broken))
    with pytest.raises(SampleError, match=r"bad\.jsonl\.gz: cannot read it after line \d+ "
                                          r"\(BadGzipFile: CRC check failed"):
        _drain(_reader(str(tmp_path / "bad.jsonl.gz")))  # was a bare BadGzipFile


def test_a_zip_of_several_files_is_an_error_not_its_first_file(tmp_path):
    import zipfile

    data = _prose_jsonl(1)
    with zipfile.ZipFile(tmp_path / "corpus.jsonl.zip", "w") as z:
        z.writestr("corpus/", "")
        z.writestr("corpus/part-0.jsonl", data)
        z.writestr("corpus/part-1.jsonl", data)
    with pytest.raises(SampleError, match=r"corpus\.jsonl\.zip is a zip archive of 2 files \(corpus/part-0\.jsonl, "
                                          r"corpus/part-1\.jsonl\); .* unzip it"):
        _drain(_reader(str(tmp_path / "corpus.jsonl.zip")))  # was part-0's records only, without a word
    with zipfile.ZipFile(tmp_path / "one.jsonl.zip", "w") as z:
        z.writestr("corpus/", "")  # a folder entry is not a file
        z.writestr("corpus/part-0.jsonl", data)
    assert len(_drain(_reader(str(tmp_path / "one.jsonl.zip")))) == data.count(b"\n")


def test_a_tar_archive_of_jsonl_files_is_named_not_read_as_lines(tmp_path):
    import io
    import tarfile

    data = _prose_jsonl(1)
    for name, mode, form in (("corpus.tar.gz", "w:gz", tarfile.PAX_FORMAT), ("corpus.tar", "w", tarfile.GNU_FORMAT)):
        with tarfile.open(tmp_path / name, mode, format=form) as tar:
            for part in ("part-0.jsonl", "part-1.jsonl"):
                info = tarfile.TarInfo(part)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        for on_error in ("raise", "skip"):  # skip gave most records and a few bad lines per member
            with pytest.raises(SampleError, match=rf"{name.replace('.', '[.]')}: it is a tar archive"):
                _drain(_reader(str(tmp_path / name), on_error=on_error))
    text = tmp_path / "gustar.txt"  # the word at the magic's place is text, not a tar header
    text.write_text("x" * 256 + "gustar mucho\n")
    assert _drain(_reader(str(text), format="lines"))[0]["text"].endswith("gustar mucho")


def test_utf16_text_is_named_not_read_as_a_screen_of_bad_lines(tmp_path):
    text = "".join(json.dumps({"text": t}, ensure_ascii=False) + "\r\n" for t in _prose()[-11:])
    (tmp_path / "ps.jsonl").write_bytes(b"\xff\xfe" + text.encode("utf-16-le"))  # PowerShell 5: cmd > ps.jsonl
    (tmp_path / "be.txt").write_bytes(text.encode("utf-16"))  # (big or little endian, its mark first)
    for name, fmt in (("ps.jsonl", "jsonl"), ("be.txt", "lines")):
        for on_error in ("raise", "skip"):  # skip skipped every line as "not utf-8 text"
            with pytest.raises(SampleError, match=rf"{name.replace('.', '[.]')}: it is UTF-16 text .* to UTF-8"):
                _drain(_reader(str(tmp_path / name), format=fmt, on_error=on_error))


def test_a_compression_the_name_hides_or_that_needs_a_package_is_named(tmp_path, monkeypatch):
    from fsspec.utils import infer_compression

    data = _prose_jsonl(1000)
    (tmp_path / "hidden.jsonl").write_bytes(gzip.compress(data))  # gzipped, named as text
    for fmt in ("jsonl", "lines"):
        for on_error in ("raise", "skip"):  # not a screen of "not utf-8" lines, nor all of them skipped
            with pytest.raises(SampleError, match=r"hidden\.jsonl: it is gzip-compressed but its name does "
                                                  r"not end in \.gz"):
                _drain(_reader(str(tmp_path / "hidden.jsonl"), format=fmt, on_error=on_error))
    (tmp_path / "plain.jsonl").write_bytes(b'{"text": "BZh91AY& is text"}\n' + data)
    assert len(_drain(_reader(str(tmp_path / "plain.jsonl")))) == data.count(b"\n") + 1
    (tmp_path / "bzh.txt").write_bytes(b"BZh9 is a line of text\n")
    assert _drain(_reader(str(tmp_path / "bzh.txt"), format="lines"))[0]["text"] == "BZh9 is a line of text"
    # .zst with zstandard installed (the [test] extra has it): fsspec reads it, and so does read_jsonl
    import fsspec.compression
    import fsspec.utils
    import zstandard

    (tmp_path / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    assert infer_compression("a.jsonl.zst") == "zstd"
    texts = [r["text"] for r in _drain(_reader(str(tmp_path / "a.jsonl.zst"), on_error="skip"))]
    assert texts == [r["text"] for r in _drain(_reader(str(tmp_path / "plain.jsonl")))][1:]
    # and where it is missing, fsspec registers no zstd codec (it registers one at import only if
    # the package imports): the same file is named, not read as a screen of not-utf-8 lines
    with monkeypatch.context() as m:
        m.delitem(fsspec.utils.compressions, "zst")
        m.delitem(fsspec.compression.compr, "zstd")
        assert infer_compression("a.jsonl.zst") is None
        with pytest.raises(SampleError, match=r"a\.jsonl\.zst: zstd-compressed files need the zstandard "
                                              r"package: pip install zstandard"):
            _drain(_reader(str(tmp_path / "a.jsonl.zst"), on_error="skip"))  # was every line skipped as not utf-8


@pytest.mark.timeout(30)
def test_a_line_of_many_blocks_is_read_in_linear_time_and_resumes(tmp_path, monkeypatch):
    from conveyor.nodes import read_jsonl

    # a single-line export (a whole corpus as one JSON value) is a line of thousands of blocks;
    # each block was added to the line read so far, copying it again: 49 s for a 200 MB line, and
    # here (2 MB in blocks of 16 bytes) minutes, against a fraction of a second
    monkeypatch.setattr(read_jsonl, "BLOCK", 16)
    long = (" ".join(_prose()) * 20)[: 2 << 20]
    path = _write_jsonl(tmp_path / "long.jsonl", ["first", long, "after it"])
    with path.open("ab") as f:
        f.write(json.dumps({"text": long[:100]}).encode())  # and a last line without a newline
    out = _drain(_reader(str(path)))
    assert [r["text"] for r in out] == ["first", long, "after it", long[:100]]
    node = _reader(str(path))
    node.reset()
    next(node), next(node)
    state = node.state_dict()
    assert [r["text"] for r in _drain(_reader(str(path)), state)] == ["after it", long[:100]]


def test_read_jsonl_resumes_mid_file_by_byte_offset_at_every_step(tmp_path):
    _corpus(tmp_path, files=3, per_file=7)
    full = _drain(_reader(f"{tmp_path}/*.jsonl"))
    node = _reader(f"{tmp_path}/*.jsonl")
    node.reset()
    states = [json.loads(json.dumps(node.state_dict()))]
    for _ in node:
        states.append(json.loads(json.dumps(node.state_dict())))
    for k, state in enumerate(states):
        assert [r["index"] for r in _drain(_reader(f"{tmp_path}/*.jsonl"), state)] == \
            [r["index"] for r in full[k:]]
    # mid-file: the state is a byte offset, and a restore seeks instead of re-reading
    state = states[3]
    path = Path(full[2]["file"])
    assert state["offset"] == len(b"".join(path.read_bytes().splitlines(keepends=True)[:3]))
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(b"x" * (len(ln) - 1) + b"\n" for ln in lines[:3]) + b"".join(lines[3:]))
    assert [r["text"] for r in _drain(_reader(f"{tmp_path}/*.jsonl"), state)] == [r["text"] for r in full[3:]]


def _mixed_lines(path: Path) -> Path:
    """A file whose lines take every path of read_jsonl's parse: plain records, a byte order
    mark, a blank line, bad JSON, a non-object, an empty field, a flat record whose text holds
    many brackets, a nested record with many, and one nested too deep for the line path's
    fast parse."""
    lines = ['{"text": "a", "label": 3}', "   ", '{"text": "b"}', "{not json",
             "[1, 2]", '{"text": ""}', json.dumps({"text": "[" * 300 + "{" * 300}),
             json.dumps({"text": "n", "deep": [[[1]]] * 100}), '{"text": "d", "x": ' + "[" * 300 + "]" * 300 + "}"]
    lines += [json.dumps({"text": f"r{i}", "k": i}) for i in range(40)]
    lines = ['\ufeff{"text": "first"}'] + lines * 3
    path.write_bytes("\n".join(lines).encode("utf-8"))  # the last line without its newline
    return path


def test_read_jsonl_many_at_once_gives_what_line_by_line_gives(tmp_path, monkeypatch):
    """next_many parses a block's lines in one C-level loop where it can; the records, the
    skips and the state after each list are those of as many next() calls."""
    _mixed_lines(tmp_path / "m.jsonl")
    fast = ReadJsonl._fast_chunk
    parsed: list[int] = []

    def counted(self, *args):
        got = fast(self, *args)
        parsed.append(len(got) if got is not None else 0)
        return got

    monkeypatch.setattr(ReadJsonl, "_fast_chunk", counted)
    one = _reader(f"{tmp_path}/*.jsonl", on_error="skip")
    one.reset()
    by_one, states_one = [], []
    for record in one:
        by_one.append(record)
        states_one.append(one.state_dict())
    many = _reader(f"{tmp_path}/*.jsonl", on_error="skip")
    many.reset()
    got: list = []
    for n in [10, 40, 7, 1, 3, 30, 2, 46, 256, 256]:
        try:
            part = many.next_many(n)
        except StopIteration:
            break
        got += part
        assert many.state_dict() == states_one[len(got) - 1]
    assert got == by_one
    assert len(by_one) == 1 + 3 * 45 and many.skipped == one.skipped == 3 * 3
    assert [r["line"] for r in by_one[:4]] == [1, 2, 4, 8]
    assert 40 in parsed and 30 in parsed  # the clean runs of lines went the one-loop way


def test_read_jsonl_bad_line_in_a_list_is_named_by_its_line(tmp_path):
    texts = [json.dumps({"text": f"t{i}"}) for i in range(30)]
    texts[17] = '{"text": 5}'
    (tmp_path / "b.jsonl").write_text("\n".join(texts) + "\n", encoding="utf-8")
    node = _reader(f"{tmp_path}/*.jsonl")
    node.reset()
    assert len(node.next_many(10)) == 10
    with pytest.raises(SampleError, match=r"b\.jsonl:18: "):
        node.next_many(256)


# ----- tokenizers ---------------------------------------------------------------------------


def test_byte_tokenize():
    out = byte_tokenize({"text": "héllo", "index": 4, "label": 2, "file": "f", "line": 9, "x": 1},
                        max_length=4, add_bos=True, add_eos=True)
    assert out["input_ids"].dtype == torch.long and out["input_ids"].tolist() == [256, 104, 195, 257]
    assert {k: out[k] for k in ("index", "label", "file", "line")} == {"index": 4, "label": 2, "file": "f", "line": 9}
    assert "x" not in out
    assert byte_tokenize("").get("input_ids").shape == (0,)
    with pytest.raises(SampleError, match="f.jsonl:3: no field 'text'"):
        byte_tokenize({"body": "x", "file": "f.jsonl", "line": 3})
    with pytest.raises(ValueError, match="max_length"):
        byte_tokenize("abc", max_length=1, add_bos=True)


def test_vocab_tokenize_and_cache(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("<pad>\n<unk>\n<bos>\n<eos>\nthe\ncat\n")
    load_vocab.cache_clear()
    out = vocab_tokenize({"text": "The cat sat", "index": 1}, vocab=str(vocab), lowercase=True, eos="<eos>")
    assert out["input_ids"].tolist() == [4, 5, 1, 3] and out["index"] == 1
    vocab_tokenize("cat", vocab=str(vocab))
    assert load_vocab.cache_info().hits >= 1 and load_vocab.cache_info().misses == 1
    assert vocab_tokenize("the cat the", vocab=str(vocab), max_length=2)["input_ids"].tolist() == [4, 5]
    with pytest.raises(ValueError, match="not in the vocabulary"):
        vocab_tokenize("x", vocab=str(vocab), unk="<nope>")
    assert len(load_vocab(str(SAMPLE / "vocab.txt"))) > 1000


def test_a_vocabulary_saved_by_a_windows_tool_keeps_its_first_token(tmp_path):
    vocab = tmp_path / "vocab-bom.txt"
    vocab.write_bytes("\ufeff<unk>\r\nthe\r\nвремя\r\n".encode())  # Notepad's UTF-8: a BOM, CRLF
    assert load_vocab(str(vocab)) == {"<unk>": 0, "the": 1, "время": 2}
    # was "unk='<unk>' is not in the vocabulary": token 0 was '\ufeff<unk>'
    assert vocab_tokenize("the время x", vocab=str(vocab))["input_ids"].tolist() == [1, 2, 0]


def test_vocab_tokenize_takes_the_lists_of_a_batch_map(tmp_path, write_spec):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("<pad>\n<unk>\nthe\ncat\nsat\n")
    _write_jsonl(tmp_path / "data" / "a.jsonl", ["the cat sat", "cat", "the the the cat", "sat", "dog"])
    kw = dict(vocab=str(vocab), max_length=3)
    assert [o["input_ids"].tolist() for o in vocab_tokenize(["the cat", {"text": "dog sat"}], **kw)] == [
        [2, 3], [1, 4]]
    # with `batch: 2` its map gave it lists, and every record failed as "item: no field 'text'"
    batches = {}
    for batch in ("", ", batch: 2"):
        spec = write_spec(f"""
nodes:
  files: {{op: list_files, url: "{tmp_path}/data/*.jsonl"}}
  read:  {{op: read_jsonl}}
  tok:   {{op: map, fn: "conveyor.text:vocab_tokenize", args: {{vocab: "{vocab}", max_length: 3}}{batch}}}
  batch: {{op: batch, size: 2}}
  pad:   {{op: pad_collate, fields: [input_ids]}}
""", f"spec{len(batch)}.yaml")
        with load_graph(spec) as loader:
            batches[batch] = [b["input_ids"].tolist() for b in loader]
    assert batches[""] == batches[", batch: 2"] == [[[2, 3, 4], [3, 0, 0]], [[2, 2, 2], [4, 0, 0]], [[1]]]
    with pytest.raises(SampleError, match="expected a record .* got a list of 1"):
        vocab_tokenize([["nested"]], **kw)


# ----- pad_collate --------------------------------------------------------------------------

DTYPES = [torch.long, torch.int32, torch.uint8, torch.int8, torch.float32, torch.float16, torch.float64,
          torch.bfloat16]  # bfloat16: numpy has none, so the torch path


@st.composite
def batches(draw: Any) -> tuple[list[dict], dict[str, Any]]:
    n = draw(st.integers(1, 12))
    dtype = draw(st.sampled_from(DTYPES))
    lengths = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    kind = draw(st.sampled_from(["tensor", "list", "numpy"]))  # numpy: the batch tokenizers' output
    samples = []
    for i, L in enumerate(lengths):
        ids = torch.arange(1, L + 1).to(dtype)
        if kind == "list" and dtype == torch.long:
            ids = ids.tolist()
        elif kind == "numpy" and dtype != torch.bfloat16:
            ids = ids.numpy()
        samples.append({"ids": ids, "label": i % 3, "name": f"s{i}"})
    kw = {"side": draw(st.sampled_from(["right", "left"])),
          "pad_to_multiple_of": draw(st.sampled_from([None, 1, 8])),
          "pad_value": draw(st.sampled_from([0, 7, {"ids": 9}]))}
    return samples, kw


@settings(max_examples=150, deadline=None)
@given(batches())
def test_pad_collate_shapes_masks_lengths_dtypes(case):
    samples, kw = case
    batch, real, padded = pad_collate(samples, **kw)
    lengths = [len(s["ids"]) for s in samples]
    first = samples[0]["ids"]
    dtype = torch.long if isinstance(first, list) else torch.as_tensor(first).dtype
    m = kw["pad_to_multiple_of"] or 1
    T = -(-max(lengths) // m) * m
    ids, mask = batch["ids"], batch["attention_mask"]
    assert ids.shape == (len(samples), T) and ids.dtype == dtype
    assert mask.shape == ids.shape and mask.dtype == torch.long
    assert batch["lengths"].tolist() == lengths and batch["lengths"].dtype == torch.long
    assert mask.sum(1).tolist() == lengths
    pv = kw["pad_value"]["ids"] if isinstance(kw["pad_value"], dict) else kw["pad_value"]
    for row, L, s in zip(range(len(samples)), lengths, samples):
        real_part = ids[row, :L] if kw["side"] == "right" else ids[row, T - L:]
        pad_part = ids[row, L:] if kw["side"] == "right" else ids[row, : T - L]
        assert real_part.tolist() == torch.as_tensor(s["ids"], dtype=dtype).tolist()
        assert (pad_part == pv).all()
        assert (mask[row].bool() == (torch.arange(T) < L if kw["side"] == "right" else torch.arange(T) >= T - L)).all()
    assert batch["label"].tolist() == [s["label"] for s in samples]
    assert batch["name"] == [s["name"] for s in samples]
    assert real == sum(lengths) and padded == len(samples) * T


def test_a_sequence_field_left_out_of_fields_is_named_with_its_samples(tmp_path):
    texts = ["Return the length of an object.", "شكرا", "👍🏽 done"]
    _write_jsonl(tmp_path / "t.jsonl", texts)
    records = [byte_tokenize(r) for r in _drain(_reader(str(tmp_path / "t.jsonl")))]
    samples = [{**r, "labels": r["input_ids"].clone()} for r in records]  # labels: a causal LM's targets
    node = PadCollate(IterableWrapper([samples]), fields=["input_ids"])
    with pytest.raises(ValueError, match=r"field 'labels' is not padded \(it is not in fields\) and its samples "
                                         r"differ in shape: \(31,\) in sample 0 \(\S*t\.jsonl:1\), \(8,\) in "
                                         r"sample 1 \(\S*t\.jsonl:2\); name it in fields") as err:
        next(node)  # was torch's bare "stack expects each tensor to be equal size"
    assert "in pad_collate" in err.value.__notes__
    with pytest.raises(ValueError, match=r"field 1 is not padded"):
        pad_collate([(torch.arange(3), torch.arange(3)), (torch.arange(2), torch.arange(2))], fields=[0])
    batch, _, _ = pad_collate(samples, fields=["input_ids", "labels"])
    assert batch["labels"].tolist() == batch["input_ids"].tolist()


def test_a_pad_value_the_narrow_ids_cannot_hold_names_the_field_and_the_dtype_to_give():
    texts = ["Return the absolute value of the argument.", "שלום", "👨‍👩‍👧"]
    samples = [{**s, "labels": s["input_ids"].copy()} for s in byte_tokenize(texts, dtype="uint8")]
    pad_value = {"input_ids": 0, "labels": -100}  # the loss's ignore_index
    for batch in (samples, [{k: torch.from_numpy(v) for k, v in s.items()} for s in samples]):
        node = PadCollate(IterableWrapper([batch]), fields=["input_ids", "labels"], pad_value=pad_value)
        with pytest.raises(ValueError, match=r"field 'labels': pad value -100 does not fit its dtype uint8 "
                                             r"\(the samples'\); .*dtype: int64") as err:
            next(node)  # was numpy's bare "Python integer -100 out of bounds for uint8"
        assert "in pad_collate" in err.value.__notes__
        out, _, _ = pad_collate(batch, fields=["input_ids", "labels"], pad_value=pad_value, dtype=torch.int64)
        assert out["labels"][1].tolist() == list("שלום".encode()) + [-100] * (len(texts[0]) - 8)
    with pytest.raises(ValueError, match=r"pad value 0.5 does not fit its dtype int64"):
        pad_collate([[1, 2], [3]], pad_value=0.5)  # was padded with 0, silently


def test_pad_collate_several_fields_tuples_and_bare_sequences():
    samples = [{"a": [1, 2], "b": torch.tensor([1.5]), "y": 0}, {"a": [3], "b": torch.tensor([2.5, 3.5]), "y": 1}]
    batch, _, _ = pad_collate(samples, pad_value={"a": -1, "b": 0.0})
    assert batch["a"].tolist() == [[1, 2], [3, -1]] and batch["b"].dtype == torch.float32
    assert set(batch) == {"a", "b", "y", "a_lengths", "a_mask", "b_lengths", "b_mask"}
    only_a, _, _ = pad_collate([{"a": [1, 2], "b": torch.ones(3)}, {"a": [3], "b": torch.zeros(3)}], fields=["a"])
    assert set(only_a) == {"a", "b", "lengths", "attention_mask"} and only_a["b"].shape == (2, 3)
    tup, _, _ = pad_collate([(torch.tensor([1, 2, 3]), 0), (torch.tensor([4]), 1)], side="left")
    padded, label, lengths, mask = tup
    assert padded.tolist() == [[1, 2, 3], [0, 0, 4]] and label.tolist() == [0, 1]
    assert lengths.tolist() == [3, 1] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    bare, _, _ = pad_collate([[1], [2, 3]], pad_to_multiple_of=4)
    assert bare[0].shape == (2, 4) and bare[1].tolist() == [1, 2]
    with pytest.raises(ValueError, match="already have fields"):
        pad_collate([{"ids": [1], "lengths": 3}])


def test_pad_field_pads_the_first_dim_of_any_shape_on_both_paths():
    from conveyor.nodes.pad_collate import pad_field

    rows = [torch.arange(6.0).view(3, 2), torch.empty(0, 2), torch.tensor([[7.0, 8.0]])]
    pad = [9, 9]
    expected = {"right": [[[0, 1], [2, 3], [4, 5], pad], [pad] * 4, [[7, 8], pad, pad, pad]],
                "left": [[pad, [0, 1], [2, 3], [4, 5]], [pad] * 4, [pad, pad, pad, [7, 8]]]}
    for side, want in expected.items():
        for grad in (False, True, "numpy"):  # tensors needing grad take torch's path; arrays their own
            seqs = [r.numpy() if grad == "numpy" else r.clone().requires_grad_(grad) for r in rows]
            padded, lengths, mask = pad_field(seqs, pad_value=9, side=side, multiple=4)
            assert padded.shape == (3, 4, 2) and padded.tolist() == want, (side, grad)
            assert lengths.tolist() == [3, 0, 1]
            assert mask.tolist() == ([[1, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0]] if side == "right"
                                     else [[0, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 1]])
    with pytest.raises(ValueError, match="field 'feat': sequences must agree in every dim but the first"):
        pad_field([torch.zeros(2, 2), torch.zeros(2, 3)], name="feat")


def test_pad_collate_dtype_casts_every_padded_field_on_both_paths():
    samples = [{"a": [1, 2], "b": np.array([1.5], np.float64), "c": torch.tensor([3], dtype=torch.int16)},
               {"a": [3], "b": np.array([2.5, 3.5], np.float64), "c": torch.tensor([4, 5], dtype=torch.int16)}]
    batch, _, _ = pad_collate(samples, fields=["a", "b", "c"], pad_value={"a": -1}, dtype=torch.float32)
    assert all(batch[k].dtype == torch.float32 for k in "abc")
    assert batch["a"].tolist() == [[1, 2], [3, -1]] and batch["b"].tolist() == [[1.5, 0], [2.5, 3.5]]
    assert batch["c"].tolist() == [[3, 0], [4, 5]] and batch["a_mask"].dtype == torch.int64
    narrow = [{"ids": np.array([200, 7], np.uint8)}, {"ids": np.array([255], np.uint8)}]
    node = PadCollate(IterableWrapper([narrow]), pad_value=0, dtype="int64")
    assert next(node)["ids"].tolist() == [[200, 7], [255, 0]] and node.dtype == torch.int64
    with pytest.raises(ValueError, match="pad value 256 does not fit dtype='uint8'"):
        PadCollate(IterableWrapper([]), pad_value=256, dtype="uint8")


def test_pad_collate_node_counts_tokens():
    node = PadCollate(IterableWrapper([[{"ids": [1, 2, 3]}, {"ids": [4]}], [{"ids": [5]}]]),
                      pad_to_multiple_of=4)
    out = _drain(node)
    assert [b["ids"].shape for b in out] == [(2, 4), (1, 4)]
    assert node.stats() == {"real_tokens": 5, "padded_tokens": 12, "padding_efficiency": round(5 / 12, 4),
                            "efficiency_min": 0.25}
    with pytest.raises(ValueError, match="side='middle'"):
        PadCollate(IterableWrapper([]), side="middle")


@pytest.mark.parametrize("labelled_first", [True, False])
def test_samples_of_a_batch_with_other_fields_are_named_not_dropped(labelled_first):
    with_label = {"input_ids": [1, 2], "label": 3, "file": "a.jsonl", "line": 4}
    without = {"input_ids": [5], "file": "b.jsonl", "line": 9}
    samples = [with_label, without] if labelled_first else [without, with_label]
    # a label only some samples carry was a bare KeyError, or (first sample unlabelled) left out
    with pytest.raises(ValueError, match=r"sample 1 \((a|b).jsonl:(4|9)\) of the batch (lacks|has) fields \['label'\]"):
        pad_collate(samples)
    with pytest.raises(ValueError, match="sample 1 of the batch is a list"):
        pad_collate([{"input_ids": [1]}, [2]])
    with pytest.raises(ValueError, match="sample 1 of the batch is a int"):
        pad_collate([{"input_ids": [1]}, 7])


def test_mixing_a_labelled_and_an_unlabelled_source_names_the_sample_and_node(tmp_path, write_spec):
    _write_jsonl(tmp_path / "plain" / "a.jsonl", ["one text", "two texts"])
    (tmp_path / "tagged").mkdir()
    (tmp_path / "tagged" / "b.jsonl").write_text('{"text": "labelled", "label": 1}\n', encoding="utf-8")
    spec = write_spec(f"""
nodes:
  fa:  {{op: list_files, url: "{tmp_path}/plain/*.jsonl"}}
  ra:  {{op: read_jsonl}}
  fb:  {{op: list_files, url: "{tmp_path}/tagged/*.jsonl"}}
  rb:  {{op: read_jsonl}}
  mix: {{op: mix, input: [ra, rb], weights: [1, 1]}}
  tok: {{op: map, fn: "conveyor.text:byte_tokenize"}}
  batch: {{op: batch, size: 3}}
  pad: {{op: pad_collate, fields: [input_ids]}}
""")
    with load_graph(spec) as loader, pytest.raises(ValueError, match="of the batch (lacks|has) fields") as err:
        list(loader)
    assert any("node 'pad' (pad_collate)" in note for note in err.value.__notes__)


# ----- through the nodes: too long, and an overflow naming file and line -----------------------


def test_too_long_sequence_names_file_and_line(tmp_path):
    _write_jsonl(tmp_path / "long.jsonl", ["short", "x" * 50, "ok"])

    def graph(**kw: Any) -> BucketBatch:
        tok = Map(_reader(str(tmp_path / "long.jsonl")), fn=byte_tokenize)
        return BucketBatch(tok, boundaries=[10], batch_sizes=[4], **kw)

    with pytest.raises(SampleError, match=r"long\.jsonl:2 has length 50, over the last boundary 10"):
        _drain(graph())
    node = graph(overflow="skip")
    assert sorted(len(x["input_ids"]) for b in _drain(node) for x in b) == [2, 5]
    assert node.stats()["overflow"] == 1
    node = graph(overflow="truncate")
    assert sorted(len(x["input_ids"]) for b in _drain(node) for x in b) == [2, 5, 10]


def test_documents_overflow_skip_leaves_out_are_named_logged_and_resumed(tmp_path, write_spec, caplog):
    docs = _prose()
    long = sorted(i for i, t in enumerate(docs) if len(t.encode()) > 1024)
    assert 3 <= len(long) < len(docs) // 2
    _write_jsonl(tmp_path / "docs.jsonl", docs)
    spec = write_spec(f"""
nodes:
  files: {{op: list_files, url: "{tmp_path}/*.jsonl"}}
  read:  {{op: read_jsonl}}
  tok:   {{op: map, fn: "conveyor.text:byte_tokenize", batch: 64}}
  batch: {{op: bucket_batch, boundaries: [256, 1024], max_tokens: 4096, overflow: skip, pool: 2}}
  pad:   {{op: pad_collate}}
""")
    with caplog.at_level("WARNING"), load_graph(spec) as loader:
        seen = []
        for i, batch in enumerate(loader):
            seen += batch["line"].tolist()
            if i == 3:
                state = loader.state_dict()
        skipped = loader.skipped()
    # they were counted in stats()["overflow"] only: not logged, not in the ledger of skips
    assert sorted(seen + [i + 1 for i in long]) == list(range(1, len(docs) + 1))
    assert skipped["count"] == len(long)
    assert sorted(e["sample"] for e in skipped["entries"]) == sorted(f"{tmp_path}/docs.jsonl:{i + 1}" for i in long)
    assert all(e["node"] == "batch" and "over the last boundary 1024 (overflow: skip)" in e["message"]
               for e in skipped["entries"])
    assert f"docs.jsonl:{long[0] + 1}: length" in caplog.text
    with load_graph(spec) as loader:  # a resume replays some of them: they are not named twice
        loader.load_state_dict(state)
        list(loader)
        assert loader.skipped()["count"] == len(long)


# ----- specs/text.yaml ----------------------------------------------------------------------


def _find(state: Any, key: str) -> dict:
    """The nested node state that has ``key`` (bucket_batch's, for "replay")."""
    if isinstance(state, dict):
        if key in state:
            return state
        for v in state.values():
            found = _find(v, key)
            if found:
                return found
    return {}


def test_text_spec_validates_and_runs_on_the_sample():
    plan = check_spec(SPEC)
    assert [n.op.name for n in plan.nodes.values()] == [
        "list_files", "shard", "read_jsonl", "shuffle_buffer", "map", "bucket_batch", "pad_collate", "prefetch"]
    with load_graph(SPEC) as loader:
        seen: list[int] = []
        for batch in loader:
            B, T = batch["input_ids"].shape
            assert T % 8 == 0 and B * T <= 8192
            assert batch["attention_mask"].sum().item() == batch["lengths"].sum().item()
            seen += batch["index"].tolist()
        stats = loader.stats()["nodes"]
    n_records = sum(len(p.read_bytes().splitlines()) for p in SAMPLE.glob("*.jsonl"))
    assert sorted(seen) == sorted(set(seen)) and len(seen) == n_records
    assert stats["collate"]["padding_efficiency"] >= 0.95
    assert stats["batch"]["padding_efficiency"] == stats["collate"]["padding_efficiency"]


def test_text_spec_resumes_exactly_from_every_step_of_two_epochs(tmp_path):
    root = _corpus(tmp_path / "data", files=3, per_file=50)
    params = {"root": str(root), "max_tokens": 1024, "pool": 1}  # small pools: many fill mid-epoch

    def make():
        return load_graph(SPEC, **params)

    with make() as loader:
        batches, states = run_with_states(loader, 2)
    inner = [_find(rank_states(s)[0]["graph"], "replay") for s in states]
    assert len(batches) >= 20
    # mid-pool (emitting one bucket), end-of-epoch flush, and pending pools after a replay point
    assert any(b["emitting"] >= 0 for b in inner) and any(b["emitting"] == -2 for b in inner)
    assert any(b["emitting"] == -1 and b["replay"] > 0 and any(b["done"]) for b in inner)
    assert check_resume(make, epochs=2) == len(batches)  # every step, states JSON round-tripped


@pytest.mark.parametrize("node, param, message", [
    ("read: {op: read_jsonl, format: csv}", "format", "one of jsonl|lines"),
    ("read: {op: read_jsonl, on_error: ignore}", "on_error", "one of raise|skip"),
    ("pad: {op: pad_collate, side: middle}", "side", "one of right|left"),
    ("pad: {op: pad_collate, fields: [a], pad_value: {b: 1}}", "pad_value", "not padded: ['b']"),
    ("pad: {op: pad_collate, dtype: long}", "dtype", "must be one of int64, int32"),
    ("pad: {op: pad_collate, dtype: uint8, pad_value: -1}", "dtype", "pad value -1 does not fit dtype='uint8'"),
    ("pad: {op: pad_collate, dtype: int32, pad_value: 0.5}", "dtype", "pad value 0.5 does not fit"),
])
def test_text_ops_spec_errors(write_spec, node, param, message):
    name = node.split(":")[0]
    lines = ['files: {op: list_files, url: "x/*.jsonl"}',
             "read: {op: read_jsonl}" if name != "read" else node,
             "batch: {op: batch, size: 2}"] + ([node] if name == "pad" else [])
    path = write_spec("nodes:\n" + "".join(f"  {ln}\n" for ln in lines))
    with pytest.raises(SpecErrors) as info:
        check_spec(path)
    errors = [e for e in info.value.errors if e.node == name]
    assert errors and errors[0].param == param and message in errors[0].message, info.value


def test_make_text_sample_script_writes_a_long_tailed_corpus(tmp_path, forker):
    import sys

    out = tmp_path / "sample"
    res = forker.run([sys.executable, str(ROOT / "examples" / "data" / "make_text_sample.py"),
                      "--out", str(out), "--records", "400", "--files", "2", "--vocab-size", "100"], timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "records in 2 files" in res.stdout
    parts = sorted(out.glob("part-*.jsonl"))
    assert len(parts) == 2
    records = [json.loads(line) for p in parts for line in p.read_text(encoding="utf-8").splitlines()]
    assert 200 <= len(records) <= 800 and all(r["text"].strip() and r["source"] for r in records)
    lengths = sorted(len(r["text"]) for r in records)
    assert lengths[-1] > 8 * lengths[len(lengths) // 2]  # long-tailed
    vocab = (out / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert vocab[:4] == ["<pad>", "<unk>", "<bos>", "<eos>"] and len([v for v in vocab if v]) == 100
