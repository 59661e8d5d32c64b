"""One atomic write: the new contents or the old, never half; no temporary left behind."""

import json
import os

import numpy as np
import pytest

from hybrid_dlrm.common import atomic


def test_a_file_is_replaced_whole_and_its_temporary_is_gone(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("old")
    atomic.write_json(path, {"x": [1, 2]})
    assert json.loads(path.read_text()) == {"x": [1, 2]}
    assert path.read_text() == '{\n "x": [\n  1,\n  2\n ]\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_an_exception_while_writing_keeps_the_old_file(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic.atomic_write(path) as f:
        f.write(b"half of the new")
        raise RuntimeError("the writer failed")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"]


def test_the_temporary_is_hidden_and_named_after_the_writer(tmp_path):
    out = atomic.AtomicFile(tmp_path / "x.pt")
    assert out.tmp.name == f".x.pt.tmp-{os.getpid()}" and out.tmp.exists()
    out.file.write(b"abc")
    out.commit()
    assert (tmp_path / "x.pt").read_bytes() == b"abc" and not out.tmp.exists()
    named = atomic.AtomicFile(tmp_path / "y.npy", tmp=tmp_path / "y.npy.tmp")
    named.abort()
    assert not any(tmp_path.glob("y*"))


def test_streamed_npz_and_text(tmp_path):
    with atomic.atomic_write(tmp_path / "z.npz") as f:
        np.savez(f, a=np.arange(3))
    with np.load(tmp_path / "z.npz", allow_pickle=False) as z:
        assert z["a"].tolist() == [0, 1, 2]
    atomic.write_text(tmp_path / "t.txt", "é\n")
    assert (tmp_path / "t.txt").read_text(encoding="utf-8") == "é\n"


def test_a_directory_is_published_over_an_empty_one(tmp_path):
    tmp, out = tmp_path / ".art.tmp", tmp_path / "art"
    tmp.mkdir()
    (tmp / "f").write_text("1")
    out.mkdir()
    atomic.publish(tmp, out)
    assert (out / "f").read_text() == "1" and not tmp.exists()


def test_a_write_error_leaves_no_temporary(tmp_path):
    missing = tmp_path / "no" / "such" / "dir" / "f"
    with pytest.raises(FileNotFoundError):
        atomic.write_bytes(missing, b"x")


def test_common_atomic_is_the_only_rename_into_place():
    """Every file reaches its name through `publish`: os.replace / os.rename, and Path.replace /
    Path.rename with one argument (str.replace takes two), appear nowhere else. The damage probes
    of scripts/hostile_probes.py rename files to break them, not to write them."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    found = []
    for package in ("hybrid_dlrm", "data_pipeline", "embeddings", "dlrm", "perfmodel", "scripts"):
        for path in sorted((root / package).rglob("*.py")):
            if path.name == "hostile_probes.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                if node.func.attr not in ("replace", "rename"):
                    continue
                owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
                if owner == "os" or (
                    owner != "dataclasses" and len(node.args) == 1 and not node.keywords
                ):
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert len(found) == 1 and found[0].startswith("hybrid_dlrm/common/atomic.py:"), found
