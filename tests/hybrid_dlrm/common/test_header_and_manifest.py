"""One header check and one checksum manifest for every file format."""

import json
import zlib

import numpy as np
import pytest

from hybrid_dlrm.common import manifest
from hybrid_dlrm.common.crc import crc_hex, file_crc32
from hybrid_dlrm.common.header import FormatError, check_header, versions_text


class MyError(ValueError):
    pass


def test_header_names_the_file_and_what_it_is_not():
    with pytest.raises(MyError, match=r"^f.npz: not a placement plan \(format 'other'\)$"):
        check_header({"format": "other"}, "f.npz", format="p", versions=(1,),
                     what="placement plan", error=MyError)  # fmt: skip
    with pytest.raises(FormatError, match=r"^f: not a p file \(format None\)$"):
        check_header([1, 2], "f", format="p", versions=(1,))


def test_header_version_lists_what_this_code_reads():
    meta = {"format": "p", "version": 4}
    with pytest.raises(FormatError, match=r"^f: plan version 4, expected 3, 2 or 1$"):
        check_header(meta, "f", format="p", versions=(3, 2, 1), kind="plan")
    assert (
        check_header({"format": "p", "v": 2}, "f", format="p", versions=(2,), version_key="v") == 2
    )
    with pytest.raises(FormatError):  # True == 1, but it is not a version
        check_header({"format": "p", "version": True}, "f", format="p", versions=(1,))
    assert versions_text([1]) == "1" and versions_text([2, 1]) == "2 or 1"


def test_file_crc_is_zlibs_from_the_offset(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    path = tmp_path / "b"
    path.write_bytes(data)
    assert file_crc32(path, 0, chunk_bytes=4096) == zlib.crc32(data)
    assert file_crc32(path, 128) == zlib.crc32(data[128:])
    assert file_crc32(path, len(data)) == 0
    assert crc_hex(b"abc") == f"{zlib.crc32(b'abc'):08x}"


@pytest.mark.parametrize("algorithm", manifest.ALGORITHMS)
def test_a_file_record_catches_truncation_and_damage(tmp_path, algorithm):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 1000)
    record = manifest.file_record(path, algorithm)
    assert manifest.record_problem(path, record, algorithm) is None
    path.write_bytes(b"x" * 999 + b"y")
    assert manifest.record_problem(path, record, algorithm, full=False) is None
    assert "checksum" in manifest.record_problem(path, record, algorithm)
    path.write_bytes(b"x" * 10)
    assert "10 bytes" in manifest.record_problem(path, record, algorithm)
    assert manifest.digests([path, path], algorithm) == [manifest.file_digest(path, algorithm)] * 2


def test_a_sealed_record_checks_itself():
    body = {"format": "f", "files": [{"name": "a", "bytes": 3}]}
    record = json.loads(json.dumps(manifest.seal(body)))
    assert manifest.unseal(record) == body
    record["body"]["files"][0]["bytes"] = 4
    with pytest.raises(manifest.Damaged):
        manifest.unseal(record)
    with pytest.raises(KeyError):
        manifest.unseal({"body": body})
