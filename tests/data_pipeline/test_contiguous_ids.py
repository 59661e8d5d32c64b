"""Hash mode renumbered (`--contiguous-ids`): each feature's distinct value % M in the labelled
days gets id = its rank, so a table has as many rows as values, as the reference's and MLPerf's
preprocessing make them; the ids are the plain hash mode's, renumbered one to one."""

import json

import numpy as np
import pytest

from data_pipeline.__main__ import main as data_pipeline
from data_pipeline.categorical import Vocabulary
from data_pipeline.errors import DataError
from data_pipeline.preprocess import PreprocessOptions

M = 1000


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    d = tmp_path_factory.mktemp("contiguous")
    assert (
        data_pipeline(["synth", "--layout", "terabyte", "--out", str(d / "raw"), "--lines", "300"])
        == 0
    )
    for name, extra in (("plain", []), ("contiguous", ["--contiguous-ids"])):
        assert data_pipeline(["preprocess", "--dataset", "terabyte", "--raw", str(d / "raw"),
                              "--out", str(d / name), "--max-ind-range", str(M), *extra]) == 0  # fmt: skip
    return d


def _sparse(directory, day):
    return np.load(directory / f"day_{day}.sparse.npy")


def test_tables_hold_the_distinct_values_and_ids_are_their_ranks(two):
    plain, renumbered = two / "plain", two / "contiguous"
    sizes = json.loads((renumbered / "meta.json").read_text())["table_sizes"]
    assert json.loads((plain / "meta.json").read_text())["table_sizes"] == [M] * 26
    hashed = np.concatenate([_sparse(plain, day) for day in range(24)])  # every day is labelled
    for f in range(26):
        distinct = np.unique(hashed[:, f])
        assert sizes[f] == len(distinct) < M
    for day in (0, 23):
        ids, expected = _sparse(renumbered, day), _sparse(plain, day)
        for f in range(26):
            distinct = np.unique(hashed[:, f])
            assert np.array_equal(distinct[ids[:, f]], expected[:, f])  # one to one, by rank
            assert ids[:, f].max() < sizes[f]
    meta = json.loads((renumbered / "meta.json").read_text())
    assert meta["categorical"]["contiguous"] is True and meta["categorical"]["max_ind_range"] == M


def test_a_value_never_counted_takes_the_row_of_value_0(tmp_path):
    from data_pipeline.categorical import FrequencyCounter

    counter = FrequencyCounter(2)
    counter.add(0, np.array([0, 5, 9]), np.array([3, 1, 1]))
    counter.add(1, np.array([4, 7]), np.array([1, 1]))
    sizes, _ = Vocabulary.write_contiguous(tmp_path, counter)
    assert sizes == [3, 2]
    cats = np.array([[5, 7], [9, 4], [6, 8], [0, 0]])
    ids = Vocabulary(tmp_path, 2).ids(cats, np.dtype(np.int64), renumbered=True)
    # feature 0: 0 -> 0, 5 -> 1, 9 -> 2, unseen 6 -> value 0's row; feature 1 has no value 0: row 0
    assert ids.tolist() == [[1, 1], [2, 0], [0, 0], [0, 0]]


def test_the_flag_belongs_to_hash_mode_and_to_the_directorys_settings(two, tmp_path):
    with pytest.raises(DataError, match="--contiguous-ids: renumbers hash mode's ids"):
        PreprocessOptions(frequency_threshold=2, contiguous_ids=True).categorical("kaggle")
    plain = PreprocessOptions(max_ind_range=M).settings("terabyte")
    renumbered = PreprocessOptions(max_ind_range=M, contiguous_ids=True).settings("terabyte")
    assert "contiguous" not in plain["categorical"] and plain != renumbered  # old dirs unchanged
    # a directory made one way is refused for the other, naming the difference
    assert data_pipeline(["preprocess", "--dataset", "terabyte", "--raw", str(two / "raw"),
                          "--out", str(two / "plain"), "--max-ind-range", str(M), "--contiguous-ids"]) == 2  # fmt: skip
