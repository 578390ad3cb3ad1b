"""read_tar and conveyor pack on local disk: layout, determinism, tar variants, mid-shard resume."""

from __future__ import annotations

import argparse
import io
import json
import tarfile
from pathlib import Path

import pytest
from torchdata.nodes import IterableWrapper

from conveyor import SampleError, SourceError, load_graph
from conveyor.errors import ConveyorError
from conveyor.nodes.list_files import ListFiles
from conveyor.nodes.read_tar import ReadTar
from conveyor.pack import add_parser, pack, run
from conveyor.storage import parse_size
from conveyor.graphs.state import rank_states
from resume_check import check_resume, run_with_states

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples/data/imagenet-sample/train"
SPEC = ROOT / "specs/imagenet-shards.yaml"


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shards") / "train"
    pack(str(SAMPLE), str(out), shard_size="1MB")
    return out


def _tar(path: Path, members: list[tuple[str, bytes]], fmt: int = tarfile.GNU_FORMAT,
         dirs: tuple[str, ...] = ()) -> None:
    with tarfile.open(path, "w", format=fmt) as tf:
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            tf.addfile(info)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def test_pack_layout_index_and_fixed_headers(shards: Path) -> None:
    index = json.loads((shards / "index.json").read_text())
    files = sorted(SAMPLE.glob("*/*.JPEG"))
    assert index["samples"] == len(files) == sum(s["samples"] for s in index["shards"])
    assert index["classes"] == sorted(p.name for p in SAMPLE.iterdir())
    assert [s["name"] for s in index["shards"]] == sorted(p.name for p in shards.glob("*.tar"))
    assert len(index["shards"]) >= 5 and all(s["bytes"] <= 1_000_000 + 10240 for s in index["shards"])
    assert [s["first"] for s in index["shards"]][1] == index["shards"][0]["samples"]
    with tarfile.open(shards / "shard-000000.tar") as tf:
        members = tf.getmembers()
        first = files[0]
        key = f"{first.parent.name}/{first.stem}"  # the class folder and the name: unique
        assert members[0].name == key + ".jpg" and members[1].name == key + ".cls"
        assert tf.extractfile(members[0]).read() == first.read_bytes()
        assert tf.extractfile(members[1]).read() == b"0"
        assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == {(0, 0, 0, "", "", 0o644)}


def test_pack_is_deterministic_and_refuses_to_overwrite(shards: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    pack(str(SAMPLE), str(again), shard_size="1MB")
    assert sorted(p.name for p in again.iterdir()) == sorted(p.name for p in shards.iterdir())
    for p in shards.iterdir():
        assert (again / p.name).read_bytes() == p.read_bytes(), p.name
    with pytest.raises(ConveyorError, match="already holds 6 shard"):
        pack(str(SAMPLE), str(again), shard_size="1MB")
    pack(str(SAMPLE), str(again), shard_size="4MB", overwrite=True)
    assert len(list(again.glob("*.tar"))) == 2


def test_pack_command_line(tmp_path: Path, capsys) -> None:
    parser = argparse.ArgumentParser(prog="conveyor")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["pack", str(SAMPLE), str(tmp_path / "out"), "--shard-size", "2MB"])
    assert args.func is run and run(args) == 0
    out = capsys.readouterr().out
    assert "packed 200 samples of 10 classes into 3 shard(s)" in out
    with pytest.raises(SourceError, match="no file matches"):
        run(parser.parse_args(["pack", str(tmp_path / "nothing"), str(tmp_path / "o2")]))
    with pytest.raises(SystemExit, match="shard-size"):
        run(parser.parse_args(["pack", str(SAMPLE), str(tmp_path / "o3"), "--shard-size", "big"]))
    with pytest.raises(SourceError, match=r"none is a visible file ending in \.png \.webp \(found: \.jpeg \(200\)\)"):
        run(parser.parse_args(["pack", str(SAMPLE), str(tmp_path / "o4"), "--extensions", "png,.WEBP"]))
    with pytest.raises(SystemExit, match="--extensions expects"):
        run(parser.parse_args(["pack", str(SAMPLE), str(tmp_path / "o5"), "--extensions", ","]))
    assert run(parser.parse_args(["pack", str(SAMPLE), str(tmp_path / "o6"), "--extensions", ".JPEG",
                                  "--format", "lmdb"])) == 0
    assert "packed 200 samples" in capsys.readouterr().out


def test_pack_command_line_names_a_bad_output_folder_or_shard_size(tmp_path: Path) -> None:
    """An output path that is a file, or under one, and a --shard-size below 1kB ended the
    command in a bare FileExistsError, NotADirectoryError or ValueError traceback."""
    parser = argparse.ArgumentParser(prog="conveyor")
    add_parser(parser.add_subparsers(dest="command"))
    (tmp_path / "a-file").write_text("x")
    for dst in (tmp_path / "a-file", tmp_path / "a-file" / "sub"):
        with pytest.raises(ConveyorError, match=rf"pack: cannot make the output folder '{dst}' "
                                                r"\((FileExists|NotADirectory)Error"):
            run(parser.parse_args(["pack", str(SAMPLE), str(dst)]))
    with pytest.raises(SystemExit, match=r"--shard-size must be at least 1kB, got '10'"):
        run(parser.parse_args(["pack", str(SAMPLE), str(tmp_path / "o"), "--shard-size", "10"]))


def test_pack_resize_shrinks_big_images_keeps_small_ones_labels_and_counts(tmp_path: Path) -> None:
    from PIL import Image

    src = tmp_path / "src"
    made = {}  # key -> (class, size)
    for cls, key, size, fmt in [("a", "wide", (900, 300), "JPEG"), ("a", "tall", (250, 701), "PNG"),
                                ("b", "small", (120, 90), "JPEG"), ("b", "edge", (300, 200), "JPEG"),
                                ("c", "gray", (640, 480), "JPEG")]:
        (src / cls).mkdir(parents=True, exist_ok=True)
        img = Image.effect_noise(size, 40).convert("L" if key == "gray" else "RGB")
        img.save(src / cls / f"{key}.{fmt.lower()}", fmt)
        made[key] = (cls, size)
    out = tmp_path / "out"
    parser = argparse.ArgumentParser(prog="conveyor")
    add_parser(parser.add_subparsers(dest="command"))
    assert run(parser.parse_args(["pack", str(src), str(out), "--resize", "200", "--quality", "85"])) == 0
    index = json.loads((out / "index.json").read_text())
    assert index["samples"] == 5 and index["resize"] == {"shorter_side": 200, "quality": 85}
    assert index["fields"] == ["cls", "jpg"]  # the PNG was re-encoded as JPEG
    got = {s["__key__"].split("/")[1]: s for s in ReadTar(ListFiles(url=f"{out}/*.tar"), fields=["jpg", "cls"])}
    expected = {"wide": (600, 200), "tall": (200, 561), "small": (120, 90), "edge": (300, 200),
                "gray": (267, 200)}
    for key, (cls, size) in made.items():
        with Image.open(io.BytesIO(got[key]["jpg"])) as img:
            assert img.size == expected[key], key
            assert img.format == "JPEG" and img.mode == ("L" if key == "gray" else "RGB")
        assert got[key]["cls"] == "abc".index(cls)
    for key in ("small", "edge"):  # already small enough: stored byte for byte
        assert got[key]["jpg"] == (src / made[key][0] / f"{key}.jpeg").read_bytes()
    with pytest.raises(SystemExit, match="--quality must be in 1..100"):
        run(parser.parse_args(["pack", str(src), str(tmp_path / "o2"), "--resize", "9", "--quality", "0"]))
    (src / "c" / "broken.jpg").write_bytes(b"\xff\xd8 not really")
    with pytest.raises(SampleError, match=r"broken\.jpg: cannot decode to resize it"):
        pack(str(src), str(tmp_path / "o3"), resize=200)


def test_pack_resize_names_an_image_pillow_refuses_with_any_data_error(tmp_path: Path) -> None:
    """A PNG with a broken chunk is a SyntaxError in Pillow: pack --resize stopped with that bare
    error, naming no file, where conveyor.image calls it a SampleError."""
    import numpy as np
    from PIL import Image

    from conveyor import image as ci

    (tmp_path / "src" / "a").mkdir(parents=True)
    noise = np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(noise).save(buf, "PNG")
    png = buf.getvalue()
    second = png.index(b"IDAT", png.index(b"IDAT") + 4)  # Pillow writes 64 kB IDAT chunks
    (tmp_path / "src" / "a" / "broken.png").write_bytes(png[:second] + b"\x00DAT" + png[second + 4:])
    with pytest.raises(SampleError, match=r"broken\.png': cannot decode \(SyntaxError: broken PNG file"):
        ci.decode({"path": str(tmp_path / "src" / "a" / "broken.png")})
    with pytest.raises(SampleError, match=r"pack: .*broken\.png: cannot decode to resize it \(SyntaxError: "
                                          r"broken PNG file"):
        pack(str(tmp_path / "src"), str(tmp_path / "out"), resize=200)


def test_pack_keys_samples_by_class_folder_and_name(tmp_path: Path, caplog) -> None:
    for cls in ("a", "b"):  # the same name in every class folder, as Caltech-101 has
        (tmp_path / "src" / cls).mkdir(parents=True)
        (tmp_path / "src" / cls / "0001.jpg").write_bytes(cls.encode())
    (tmp_path / "src" / "a" / "more").mkdir()
    (tmp_path / "src" / "a" / "more" / "0001.jpg").write_bytes(b"a, in a subfolder")  # ImageFolder: an a
    pack(str(tmp_path / "src"), str(tmp_path / "dst"))
    got = [(s["__key__"], s["jpg"], s["cls"]) for s in ReadTar(ListFiles(url=f"{tmp_path}/dst/*.tar"))]
    assert got == [("a/0001", b"a", 0), ("a/more/0001", b"a, in a subfolder", 0), ("b/0001", b"b", 1)]
    (tmp_path / "src" / "a" / "more" / "0001.jpg").unlink()
    (tmp_path / "src" / "a" / "more").rmdir()
    (tmp_path / "src" / "a" / "README.txt").write_text("not an image")
    (tmp_path / "src" / "a" / "._0001.jpg").write_bytes(b"a macOS resource fork")
    pack(str(tmp_path / "src"), str(tmp_path / "dst1"))  # any file, but not a hidden one (named)
    got1 = [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in
            ReadTar(ListFiles(url=f"{tmp_path}/dst1/*.tar"))]
    assert got1 == [("a/0001", ["cls", "index", "jpg"]), ("a/README", ["cls", "index", "txt"]),
                    ("b/0001", ["cls", "index", "jpg"])]
    assert "pack: 1 of the 4 files" in caplog.text and "(hidden (1))" in caplog.text
    pack(str(tmp_path / "src"), str(tmp_path / "dst3"), extensions=[".JPG", "png"])  # images only
    got3 = [(s["__key__"], s["jpg"], s["cls"]) for s in ReadTar(ListFiles(url=f"{tmp_path}/dst3/*.tar"))]
    assert got3 == [("a/0001", b"a", 0), ("b/0001", b"b", 1)]
    assert "pack: 2 of the 4 files" in caplog.text and "(hidden (1), .txt (1))" in caplog.text
    (tmp_path / "src" / "b" / "0001.png").write_bytes(b"x")
    with pytest.raises(ConveyorError, match="would share the key 'b/0001'"):
        pack(str(tmp_path / "src"), str(tmp_path / "dst2"))


def test_read_tar_yields_every_sample_with_its_bytes_label_and_stable_index(shards: Path) -> None:
    files = sorted(SAMPLE.glob("*/*.JPEG"))
    classes = sorted(p.name for p in SAMPLE.iterdir())
    index = json.loads((shards / "index.json").read_text())
    samples = list(ReadTar(ListFiles(url=f"{shards}/*.tar")))
    assert [s["__key__"] for s in samples] == [f"{f.parent.name}/{f.stem}" for f in files]
    assert all(s["jpg"] == f.read_bytes() for s, f in zip(samples, files))
    assert [s["cls"] for s in samples] == [classes.index(f.parent.name) for f in files]
    expected = [i * 1_000_000 + pos for i, shard in enumerate(index["shards"]) for pos in range(shard["samples"])]
    assert [s["index"] for s in samples] == expected
    assert samples[0]["__url__"].endswith("shard-000000.tar")
    # the index belongs to the shard (its listing position), not to the reading order
    shuffled = list(ReadTar(ListFiles(url=f"{shards}/*.tar", shuffle=True, seed=3)))
    assert sorted(s["index"] for s in shuffled) == expected
    assert {s["index"]: s["__key__"] for s in shuffled} == {s["index"]: s["__key__"] for s in samples}


def test_read_tar_resumes_from_every_item_mid_shard(shards: Path) -> None:
    node = ReadTar(ListFiles(url=f"{shards}/*.tar"))
    node.reset()
    reference, states = [], [node.state_dict()]
    for item in node:
        reference.append(item["index"])
        states.append(json.loads(json.dumps(node.state_dict())))
    assert any(s["offset"] > 0 and s["pos"] > 0 for s in states)
    for k in range(0, len(states), 7):
        fresh = ReadTar(ListFiles(url=f"{shards}/*.tar"))
        fresh.reset(states[k])
        assert [item["index"] for item in fresh] == reference[k:], k


def test_read_tar_reads_long_names_pax_headers_and_skips_directories(tmp_path: Path) -> None:
    long_key = "d/" + "x" * 150
    _tar(tmp_path / "gnu.tar", [(long_key + ".jpg", b"J1"), (long_key + ".cls", b" 7\n"),
                                ("d/short.txt", b"t"), ("README", b"no field: not a sample")],
         dirs=("d/",))
    _tar(tmp_path / "pax.tar", [("é/" + "y" * 120 + ".png", b"P"), ("é/" + "y" * 120 + ".cls", b"3")],
         fmt=tarfile.PAX_FORMAT)
    out = list(ReadTar(IterableWrapper([str(tmp_path / "gnu.tar"), str(tmp_path / "pax.tar")])))
    assert [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in out] == [
        (long_key, ["cls", "index", "jpg"]), ("d/short", ["index", "txt"]),
        ("é/" + "y" * 120, ["cls", "index", "png"])]
    assert out[0]["cls"] == 7
    assert [s["index"] for s in out] == [0, 1, 1_000_000]  # records without an index: shard count


def test_hidden_members_in_a_folder_are_not_samples(tmp_path: Path) -> None:
    """macOS tar stores each file's extended attributes as a ._NAME member beside it: in a
    folder its key was the folder (train/) and the run stopped at a sample with no image."""
    _tar(tmp_path / "mac.tar", [("train/._k1.jpg", b"\x00\x05\x16\x07attrs"), ("train/k1.jpg", b"J1"),
                                ("train/k1.cls", b"1"), ("._k2.jpg", b"attrs"), ("k2.jpg", b"J2"),
                                ("k2.cls", b"2"), ("a.b/.c.d/._k3.jpg", b"attrs"), ("a.b/.c.d/k3.jpg", b"J3"),
                                ("a.b/.c.d/k3.cls", b"3")])
    out, node = _read(tmp_path / "mac.tar", fields=["jpg", "cls"])
    assert [(s["__key__"], s["jpg"], s["cls"]) for s in out] == [
        ("train/k1", b"J1", 1), ("k2", b"J2", 2), ("a.b/.c.d/k3", b"J3", 3)]


def test_a_linked_member_is_an_error_naming_the_link_or_a_counted_skip(tmp_path: Path) -> None:
    """tar (and tarfile.add) store a file whose inode was already stored as a hard link, with no
    data: read_tar passed over links, so the sample lost its image without a word (or, with
    fields, said it had no .jpg while `tar tf` lists one)."""
    src = tmp_path / "src"
    src.mkdir()
    for name, data in [("k1.jpg", b"J1"), ("k1.cls", b"1"), ("k2.cls", b"2"), ("k3.jpg", b"J3"), ("k3.cls", b"3")]:
        (src / name).write_bytes(data)
    (src / "k2.jpg").hardlink_to(src / "k1.jpg")  # a duplicate image, deduplicated on disk
    with tarfile.open(tmp_path / "s.tar", "w", format=tarfile.GNU_FORMAT) as tf:
        for name in ["k1.jpg", "k1.cls", "k2.jpg", "k2.cls", "k3.jpg", "k3.cls"]:
            tf.add(src / name, arcname=name)
    with tarfile.open(tmp_path / "s.tar") as tf:
        assert tf.getmember("k2.jpg").islnk()
    for fields in (None, ["jpg", "cls"]):
        with pytest.raises(SampleError, match=r"s\.tar: sample 'k2' at byte 2048: its \.jpg member is a "
                                              r"hard link to 'k1\.jpg': read_tar reads regular members only"):
            _read(tmp_path / "s.tar", fields=fields)
    out, node = _read(tmp_path / "s.tar", fields=["jpg", "cls"], on_error="skip")
    assert [(s["__key__"], s["jpg"], s["index"]) for s in out] == [("k1", b"J1", 0), ("k3", b"J3", 2)]
    assert node.stats()["skipped_samples"] == 1
    _tar(tmp_path / "sym.tar", [("a.cls", b"0")])
    with tarfile.open(tmp_path / "sym.tar", "a") as tf:
        info = tarfile.TarInfo("a.png")
        info.type, info.linkname = tarfile.SYMTYPE, "../elsewhere/a.png"
        tf.addfile(info)
    with pytest.raises(SampleError, match=r"sample 'a' at byte 0: its \.png member is a symbolic link "
                                          r"to '\.\./elsewhere/a\.png'"):
        _read(tmp_path / "sym.tar")


def test_a_compressed_shard_is_named_as_such(tmp_path: Path) -> None:
    import bz2
    import gzip
    import lzma

    _tar(tmp_path / "s.tar", [("a.jpg", b"J"), ("a.cls", b"0")])
    plain = (tmp_path / "s.tar").read_bytes()
    for name, data in [("gzip", gzip.compress(plain)), ("bzip2", bz2.compress(plain)), ("xz", lzma.compress(plain))]:
        (tmp_path / f"s.{name}").write_bytes(data)
        with pytest.raises(SampleError, match=rf"s\.{name}: a {name}-compressed file, not a tar archive: "
                                              r"read_tar reads uncompressed tar shards"):
            _read(tmp_path / f"s.{name}")


def test_corrupt_or_missing_shard_raises_naming_it_or_is_skipped(tmp_path: Path, shards: Path) -> None:
    good = (shards / "shard-000000.tar").read_bytes()
    (tmp_path / "a-cut.tar").write_bytes(good[:300_000])
    (tmp_path / "b-junk.tar").write_bytes(b"not a tar" * 100)
    (tmp_path / "c-good.tar").write_bytes(good)
    with pytest.raises(SampleError, match=r"a-cut\.tar: truncated member"):
        list(ReadTar(ListFiles(url=f"{tmp_path}/*.tar")))
    node = ReadTar(ListFiles(url=f"{tmp_path}/*.tar"), on_error="skip")
    out = list(node)
    assert node.stats()["skipped_shards"] == 2
    assert len(out) == 38 + sum(1 for s in out if s["__url__"].endswith("a-cut.tar"))
    with pytest.raises(SampleError, match=r"b-junk\.tar: not a tar archive, or corrupt at byte 0"):
        list(ReadTar(IterableWrapper([str(tmp_path / "b-junk.tar")])))
    with pytest.raises(SampleError, match=r"missing\.tar: no such object"):
        list(ReadTar(IterableWrapper([str(tmp_path / "missing.tar")])))


def test_imagenet_shards_spec_resumes_exactly_mid_shard(shards: Path) -> None:
    def make():
        return load_graph(SPEC, root=str(shards), batch_size=16, image_size=32, shuffle_window=8)

    with make() as loader:
        batches, states = run_with_states(loader, 2)
        assert loader.stats()["nodes"]["samples"]["items"] == 200
    assert len(batches) == 24
    offsets = [rank_states(s)[0]["graph"] for s in states]
    assert any('"offset": 0' not in json.dumps(g) for g in offsets)
    check_resume(make, epochs=2, steps=[0, 1, 5, 11, 12, 13, 19, 23, 24])


def test_parse_size() -> None:
    assert parse_size("256MB") == 256_000_000
    assert parse_size("1GiB") == 1 << 30
    assert parse_size("1.5k") == 1500
    assert parse_size(4096) == 4096
    with pytest.raises(ValueError, match="expected a size"):
        parse_size("lots")


# ----- malformed and short shards (issue 13.2, 13.6, 13.15, 13.16) ---------------------------

def _read(path: Path, **kw) -> tuple[list[dict], ReadTar]:
    node = ReadTar(IterableWrapper([str(path)]), **kw)
    try:
        return list(node), node
    finally:
        node.close()


@pytest.mark.timeout(20)  # the pax length 0 looped forever
@pytest.mark.parametrize("record", [b"0 mtime=1\n", b"zz mtime=1\n", b"99 path=x.jpg\n", b"5 mtime=1"])
def test_malformed_pax_header_is_an_error_naming_shard_and_offset(tmp_path: Path, record: bytes) -> None:
    path = tmp_path / "pax.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for name, data in [("a.jpg", b"A"), ("a.cls", b"1")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        pax = tarfile.TarInfo("././@PaxHeader")
        pax.type, pax.size = tarfile.XHDTYPE, len(record)
        tf.addfile(pax, io.BytesIO(record))
        info = tarfile.TarInfo("b.jpg")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"B"))
    with pytest.raises(SampleError, match=rf"pax\.tar: malformed pax extended header at byte 2048 "):
        _read(path)
    out, node = _read(path, on_error="skip")
    assert [s["__key__"] for s in out] == ["a"] and node.stats()["skipped_shards"] == 1


def _members(path: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(path) as tf:
        return tf.getmembers()


def test_shard_cut_between_samples_or_empty_is_an_error_or_a_counted_skip(shards: Path, tmp_path: Path) -> None:
    """`head -c` at a header boundary between samples read as a shorter shard with no error."""
    whole = (shards / "shard-000002.tar").read_bytes()
    members = _members(shards / "shard-000002.tar")
    cut = members[10].offset  # the 6th sample's .jpg header: 5 whole samples before it
    assert cut % 512 == 0 and members[10].name.endswith(".jpg")
    (tmp_path / "cut.tar").write_bytes(whole[:cut])
    with pytest.raises(SampleError, match=rf"cut\.tar: ends at byte {cut} without the end-of-archive "
                                          r"marker \(two zero blocks\): the shard is truncated"):
        _read(tmp_path / "cut.tar")
    out, node = _read(tmp_path / "cut.tar", on_error="skip")
    assert len(out) == 5 and node.stats()["skipped_shards"] == 1  # all before the cut
    (tmp_path / "empty.tar").write_bytes(b"")
    with pytest.raises(SampleError, match=r"empty\.tar: ends at byte 0 .* the shard is empty"):
        _read(tmp_path / "empty.tar")
    _, node = _read(tmp_path / "empty.tar", on_error="skip")
    assert node.stats()["skipped_shards"] == 1
    # cut between a sample's .jpg and its .cls: the shard is named, not a collate TypeError later
    cls_at = members[11].offset
    (tmp_path / "jpg-only.tar").write_bytes(whole[:cls_at])
    with pytest.raises(SampleError, match=rf"jpg-only\.tar: ends at byte {cls_at} without"):
        _read(tmp_path / "jpg-only.tar")
    (tmp_path / "one-zero-block.tar").write_bytes(whole[:cut] + bytes(512))
    with pytest.raises(SampleError, match=rf"a lone zero block at byte {cut}"):
        _read(tmp_path / "one-zero-block.tar")


def test_archives_joined_into_one_shard_are_an_error_not_half_the_samples(tmp_path: Path) -> None:
    """`cat a.tar b.tar > ab.tar` puts b after a's end-of-archive marker: read_tar (as tar and
    tarfile do by default) stopped there and the samples of b were lost without a word."""
    _tar(tmp_path / "a.tar", [("a0.jpg", b"A"), ("a0.cls", b"0")])
    _tar(tmp_path / "b.tar", [("b0.jpg", b"B"), ("b0.cls", b"1")])
    a, b = (tmp_path / "a.tar").read_bytes(), (tmp_path / "b.tar").read_bytes()
    (tmp_path / "ab.tar").write_bytes(a + b)
    with pytest.raises(SampleError, match=rf"ab\.tar: more data at byte {len(a)}, after the end-of-archive "
                                          r"marker at byte 2048: archives joined into one file"):
        _read(tmp_path / "ab.tar")
    out, node = _read(tmp_path / "ab.tar", on_error="skip")
    assert [s["__key__"] for s in out] == ["a0"] and node.stats()["skipped_shards"] == 1
    (tmp_path / "padded.tar").write_bytes(a + bytes(30_000))  # zeros after the marker: padding
    assert [s["__key__"] for s in _read(tmp_path / "padded.tar")[0]] == ["a0"]


def test_sample_counts_from_the_pack_index_are_checked(shards: Path, tmp_path: Path, caplog) -> None:
    copy = tmp_path / "train"
    copy.mkdir()
    for p in shards.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    index = json.loads((copy / "index.json").read_text())
    n = index["shards"][1]["samples"]
    index["shards"][1]["samples"] = n + 1  # as if the shard had been replaced by a shorter one
    (copy / "index.json").write_text(json.dumps(index))
    with pytest.raises(SampleError, match=rf"shard-000001\.tar: {n} samples read, but index.json lists {n + 1}"):
        list(ReadTar(ListFiles(url=f"{copy}/*.tar")))
    node = ReadTar(ListFiles(url=f"{copy}/*.tar"), on_error="skip")
    assert len(list(node)) == 200 and node.stats()["skipped_shards"] == 1  # its samples were all read
    node.close()
    (copy / "index.json").unlink()
    (copy / "index.json").mkdir()  # an index that cannot be read: said, and the counts go unchecked
    with caplog.at_level("WARNING", logger="conveyor.nodes.read_tar"):
        assert len(list(ReadTar(ListFiles(url=f"{copy}/*.tar")))) == 200
    assert "index.json" in caplog.text and "sample counts are not checked" in caplog.text


def test_sample_missing_a_field_or_with_a_bad_cls_names_shard_and_key(tmp_path: Path) -> None:
    _tar(tmp_path / "s.tar", [("a.jpg", b"A"), ("a.cls", b"1"), ("b.jpg", b"B"), ("c.jpg", b"C"),
                              ("c.cls", b"abc"), ("d.png", b"D"), ("d.cls", b"4")])
    fields = ["jpg;png", "cls"]
    with pytest.raises(SampleError, match=r"s\.tar: sample 'b' at byte 2048: no \.cls member \(it has \.jpg\)"):
        _read(tmp_path / "s.tar", fields=fields)
    out, node = _read(tmp_path / "s.tar", fields=fields, on_error="skip")
    assert [(s["__key__"], s["cls"], s["index"]) for s in out] == [("a", 1, 0), ("d", 4, 3)]
    assert node.stats()["skipped_samples"] == 2 and node.stats()["skipped_shards"] == 0
    with pytest.raises(SampleError, match=r"s\.tar: sample 'c' at byte 3072: cls b'abc' is not a class number"):
        _read(tmp_path / "s.tar")  # no fields required: b passes, c's cls does not
    with pytest.raises(ValueError, match=r"fields='jpg;png' must be a list of fields, e\.g\. \['jpg;png', 'cls'\]"):
        ReadTar(IterableWrapper([str(tmp_path / "s.tar")]), fields="jpg;png")  # each letter was a field


def test_a_sample_split_by_the_tar_order_says_how_to_make_the_shard(tmp_path: Path) -> None:
    """`tar cf shard.tar DIR` stores a folder in the file system's order: k2.cls came first and
    the error said k2 had no .jpg, which `tar tf` lists further on."""
    _tar(tmp_path / "s.tar", [("d/k2.cls", b"2"), ("d/k1.jpg", b"J1"), ("d/k1.cls", b"1"), ("d/k2.jpg", b"J2")])
    with pytest.raises(SampleError, match=r"s\.tar: sample 'd/k2' at byte 0: no \.jpg member \(it has \.cls\): "
                                          r"a sample is the members next to each other with its key; if the "
                                          r"shard holds one further on, make the shard with tar --sort=name"):
        _read(tmp_path / "s.tar", fields=["jpg", "cls"])


def test_a_sample_whose_names_have_several_dots_says_where_the_key_ends(tmp_path: Path) -> None:
    """WebDataset's rule: the key ends at the first dot, so photo.2019.jpg is field 2019.jpg of
    sample photo; the error only said there was no .jpg (it has .2019.jpg)."""
    _tar(tmp_path / "s.tar", [("d/photo.2019.jpg", b"J"), ("d/photo.2019.cls", b"1")])
    with pytest.raises(SampleError, match=r"sample 'd/photo' at byte 0: no \.jpg or \.png member \(it has "
                                          r"\.2019\.cls, \.2019\.jpg\): the key is the name up to its first "
                                          r"dot, so a \.2019\.jpg member is field '2019\.jpg'"):
        _read(tmp_path / "s.tar", fields=["jpg;png", "cls"])


def test_skips_are_logged_for_the_first_few_then_only_counted(tmp_path: Path, caplog) -> None:
    """The one rule for skips (conveyor.nodes._skips): read_tar logged a warning for every skipped
    sample, a screen of them per shard of samples without a .cls."""
    from conveyor.nodes._skips import LOGGED_SKIPS

    _tar(tmp_path / "s.tar", [(f"k{i:02d}.jpg", b"J") for i in range(3 * LOGGED_SKIPS)])
    with caplog.at_level("WARNING", logger="conveyor.nodes.read_tar"):
        out, node = _read(tmp_path / "s.tar", fields=["jpg", "cls"], on_error="skip")
    assert out == [] and node.stats()["skipped_samples"] == 3 * LOGGED_SKIPS
    assert len(node.ledger.state()["entries"]) == 3 * LOGGED_SKIPS
    skips = [r.getMessage() for r in caplog.records if "skipped a sample" in r.getMessage()]
    assert len(skips) == LOGGED_SKIPS and "further skips are only counted" in skips[-1]


def test_spec_counts_a_sample_without_cls_and_decode_errors_name_shard_and_key(tmp_path: Path) -> None:
    from conveyor.image import train_transform

    src = sorted(SAMPLE.glob("*/*.JPEG"))[:6]
    members = []
    for i, f in enumerate(src):
        members.append((f"k{i}.jpg", f.read_bytes() if i != 4 else b"not a jpeg"))
        if i != 2:
            members.append((f"k{i}.cls", b"0"))
    (tmp_path / "shards").mkdir()
    _tar(tmp_path / "shards" / "shard-000000.tar", members)
    kw = dict(root=str(tmp_path / "shards"), batch_size=2, image_size=16, shuffle_window=3)
    with load_graph(SPEC, on_error="skip", **kw) as loader:
        assert sum(len(b["label"]) for b in loader) == 4
        stats = loader.stats()["nodes"]
        ledger = {(e["node"], e["sample"].rsplit("/", 1)[-1], e["error"]) for e in loader.skipped()["entries"]}
        # read_tar's own ledger (the loader's state holds it as of the shuffle window's start)
        own = [(e[0].rsplit("/", 1)[-1], e[1]) for e in loader.nodes["samples"].ledger.state()["entries"]]
    assert stats["samples"]["skipped_samples"] == 1 and stats["decode"]["skipped"] == 1
    assert ("decode", "shard-000000.tar#k4", "SampleError") in ledger
    assert own == [("shard-000000.tar#k2", "SampleError")]
    with load_graph(SPEC, **kw) as loader:
        with pytest.raises(SampleError, match=r"shard-000000\.tar: sample 'k2' at byte \d+: no \.cls member"):
            list(loader)
    import random
    bad = {"__key__": "k4", "__url__": "s3://b/shard-000007.tar", "jpg": b"not a jpeg", "cls": 0, "index": 7}
    with pytest.raises(SampleError, match=r"image 'k4' in shard 's3://b/shard-000007\.tar'"):
        train_transform(bad, rng=random.Random(0), size=16)


def test_pack_numbers_classes_as_list_files_does_with_an_empty_class_folder(tmp_path: Path, caplog) -> None:
    """train/ packed to shards and val/ read as a folder must give one class one label: an
    empty class folder (or one with only left-out files) keeps its number in both."""
    src = tmp_path / "src"
    for cls in ("a class", "b.v2", "c_empty", "déjà vu", "e"):
        (src / cls).mkdir(parents=True)
    for cls in ("a class", "b.v2", "déjà vu", "e"):
        (src / cls / "x.jpg").write_bytes(cls.encode())
    (src / "b.v2" / "deep").mkdir()
    (src / "b.v2" / "deep" / "y.JPG").write_bytes(b"deep")
    (src / "c_empty" / "notes.txt").write_text("no image here")
    index = pack(str(src), str(tmp_path / "dst"), extensions=[".jpg"])
    folder = ListFiles(url=f"{src}/*/**", label="top_dir", extensions=[".jpg"])
    by_folder = {r["path"][len(str(src)) + 1:].rsplit(".", 1)[0]: r["label"] for r in folder.records()}
    by_shards = {s["__key__"]: s["cls"] for s in ReadTar(ListFiles(url=f"{tmp_path}/dst/*.tar"))}
    assert by_shards == by_folder == {"a class/x": 0, "b.v2/deep/y": 1, "b.v2/x": 1, "déjà vu/x": 3, "e/x": 4}
    assert index["classes"] == folder.classes == ["a class", "b.v2", "c_empty", "déjà vu", "e"]
    assert "pack: class folder(s)" in caplog.text and "c_empty" in caplog.text


def test_pack_resize_keeps_16_bit_images_as_the_loader_decodes_them(tmp_path: Path) -> None:
    """A 16-bit PNG re-encoded by --resize keeps the top 8 bits of its samples, as
    conveyor.image decodes the original; Pillow's own conversion clipped it to white."""
    import numpy as np
    from PIL import Image

    from conveyor import image as ci

    (tmp_path / "src" / "a").mkdir(parents=True)
    arr = np.full((300, 400), 0x4000, np.uint16)
    arr[:, 200:] = 0xC0FF
    Image.fromarray(arr).save(tmp_path / "src" / "a" / "deep.png")
    pack(str(tmp_path / "src"), str(tmp_path / "out"), resize=100)
    (sample,) = ReadTar(ListFiles(url=f"{tmp_path}/out/*.tar"), fields=["jpg", "cls"])
    with Image.open(io.BytesIO(sample["jpg"])) as img:
        assert img.mode == "L" and img.size == (133, 100)
    got = ci.decode({"bytes": sample["jpg"], "__key__": "a/deep"})["image"][0].float()
    original = ci.decode({"path": str(tmp_path / "src" / "a" / "deep.png")})["image"][0].float()
    assert original[0, 0] == 0x40 and original[0, -1] == 0xC0
    assert abs(got[:, :60].mean().item() - 0x40) < 2 and abs(got[:, -60:].mean().item() - 0xC0) < 2


def test_imagenet_shards_spec_reads_every_format_the_folder_specs_take(tmp_path: Path) -> None:
    """An ImageFolder of .bmp/.tif/.pgm... images packs, and imagenet-shards.yaml decodes them
    all, as imagenet.yaml does from the folder: they failed as samples without an image."""
    from PIL import Image

    src = tmp_path / "src"
    formats = [("a", "x.JPEG", "JPEG"), ("a", "y.bmp", "BMP"), ("a", "z.TIF", "TIFF"), ("b", "x.pgm", "PPM"),
               ("b", "y.ppm", "PPM"), ("b", "z.tiff", "TIFF"), ("c", "x.webp", "WEBP"), ("c", "y.Png", "PNG")]
    for i, (cls, name, fmt) in enumerate(formats):
        (src / cls).mkdir(parents=True, exist_ok=True)
        img = Image.effect_noise((48, 40), 30 + i).convert("L" if name.endswith("pgm") else "RGB")
        img.save(src / cls / name, fmt)
    pack(str(src), str(tmp_path / "shards"))
    small = {"batch_size": 1, "image_size": 16}
    with load_graph(ROOT / "specs/imagenet.yaml", root=str(src), **small) as loader:
        folder = sorted(b["label"].item() for b in loader)
    with load_graph(SPEC, root=str(tmp_path / "shards"), **small) as loader:
        shards = sorted(b["label"].item() for b in loader)
    assert shards == folder == [0, 0, 0, 1, 1, 1, 2, 2]


def test_an_index_that_is_not_there_is_not_a_failed_request(shards: Path, tmp_path: Path) -> None:
    # issue 29, item 7: shards written by another tool have no index.json; looking for it
    # is one request, not a failure in the stats (a shard that is not there is still an error)
    copy = tmp_path / "train"
    copy.mkdir()
    for p in shards.glob("*.tar"):
        (copy / p.name).write_bytes(p.read_bytes())
    rows, node = _read(copy / "shard-000000.tar")
    assert rows and node.stats()["failed"] == 0 and node.stats()["requests"] >= 1
    with pytest.raises(SampleError, match="gone.tar"):
        _read(copy / "gone.tar")
