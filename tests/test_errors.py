"""Bad input through a whole graph: the original error, naming the file and the node, comes
out of the loader's thread hand-offs unchanged; with on_error: skip it is counted instead."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conveyor import SampleError, SourceError, load_graph

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples/data/imagenet-sample/train"


@pytest.fixture
def broken_tree(tmp_path: Path) -> Path:
    for cls in sorted(SAMPLE.iterdir())[:2]:
        dst = tmp_path / cls.name
        dst.mkdir()
        for f in sorted(cls.iterdir())[:4]:
            shutil.copy(f, dst / f.name)
    good = sorted((tmp_path / "n01440764").iterdir())[0].read_bytes()
    (tmp_path / "n01440764" / "zz_truncated.JPEG").write_bytes(good[: len(good) // 3])
    (tmp_path / "n01440764" / "zz_empty.JPEG").write_bytes(b"")
    (tmp_path / "n01440764" / "zz_text.JPEG").write_text("not an image\n")
    # 40 bytes of the scan inverted: Pillow decodes this into wrong pixels without a word.
    # libjpeg sees this one; where the Huffman codes fall back into step it cannot (about a
    # third of random 40-byte corruptions of the sample): JPEG carries no checksum.
    sos = good.find(b"\xff\xda")
    start = sos + 2 + int.from_bytes(good[sos + 2 : sos + 4], "big") + 80
    scan = bytes(b ^ 0xFF if start <= i < start + 40 else b for i, b in enumerate(good))
    (tmp_path / "n01440764" / "zz_scan.JPEG").write_bytes(scan)
    return tmp_path


def test_a_corrupt_image_raises_the_original_error_naming_file_and_node(broken_tree: Path) -> None:
    with load_graph(ROOT / "specs/imagenet.yaml", root=str(broken_tree), batch_size=2, image_size=32,
                    shuffle_window=1) as loader:
        with pytest.raises(SampleError) as info:
            for _ in loader:
                pass
    err = info.value
    assert "zz_" in str(err) and str(broken_tree) in str(err)
    assert "Original Traceback" not in str(err)  # not re-created from text by a thread hand-off
    assert any("node 'decode' (map) from" in note and "imagenet.yaml" in note
               for note in getattr(err, "__notes__", []))


def test_on_error_skip_counts_every_broken_image(broken_tree: Path) -> None:
    with load_graph(ROOT / "specs/imagenet.yaml", root=str(broken_tree), batch_size=1, image_size=32,
                    on_error="skip") as loader:
        seen = [i for b in loader for i in b["index"].tolist()]
        stats = loader.stats()["nodes"]
    assert stats["decode"]["skipped"] == 4
    assert len(seen) == 8 and stats["files"]["items"] == 12


def test_a_glob_that_matches_nothing_names_the_url(tmp_path: Path) -> None:
    with load_graph(ROOT / "specs/imagenet.yaml", root=str(tmp_path / "nowhere")) as loader:
        with pytest.raises(SourceError, match="nowhere"):
            next(iter(loader))
