import json

import numpy as np
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embeddings.profile import AccessProfile, AccessProfiler, ProfileError, fit_zipf, main

SIZES = [30, 5, 200]
NAMES = ["f0", "f1", "f2"]


def jagged_kjt(rng, batch, keys=NAMES, sizes=SIZES):
    lengths = rng.integers(0, 4, (len(keys), batch))
    values = [rng.integers(0, n, int(lengths[t].sum())) for t, n in enumerate(sizes)]
    kjt = KeyedJaggedTensor(
        keys=list(keys), values=torch.from_numpy(np.concatenate(values)),
        lengths=torch.from_numpy(lengths.reshape(-1).astype(np.int32)), stride=batch,
    )  # fmt: skip
    return kjt, lengths, values


def test_counts_match_a_reference_count_and_keys_are_matched_by_name():
    rng = np.random.default_rng(0)
    prof = AccessProfiler(SIZES, NAMES, keep_inputs=10)
    ref = [np.zeros(n, np.int64) for n in SIZES]
    for _ in range(5):
        kjt, lengths, values = jagged_kjt(rng, 8)
        # the same batch with its features in another order must count the same
        perm = kjt.permute([2, 0, 1])
        prof.add_kjt(perm)
        for t, v in enumerate(values):
            np.add.at(ref[t], v, 1)
    p = prof.finish(0.5)
    for c, r in zip(p.counts, ref):
        assert c.dtype == np.int32 and np.array_equal(c, r)  # int32: half the bytes of int64
    assert p.inputs == 40 and p.kept_inputs == 10 and p.sample_lengths.shape == (3, 10)
    assert p.sample_values.size == int(p.sample_lengths.sum())


def test_counts_become_int64_before_a_table_could_pass_int32():
    prof = AccessProfiler([10, 10], ["a", "b"])
    prof.add_indices(0, np.array([3, 3, 4]))
    prof._lookups[0] = 2**31 - 2  # as after two billion lookups
    prof.add_indices(0, np.array([3, 9]))
    prof.add_indices(1, np.array([1]))
    p = prof.finish()
    assert p.counts[0].dtype == np.int64 and p.counts[0][[3, 4, 9]].tolist() == [3, 1, 1]
    assert p.counts[1].dtype == np.int32


def test_save_load_round_trip_is_exact_and_pickle_free(tmp_path):
    rng = np.random.default_rng(1)
    prof = AccessProfiler(SIZES, NAMES)
    prof.add_rows(np.stack([rng.integers(0, n, 50) for n in SIZES], 1))
    p = prof.finish(0.05)
    path = p.save(tmp_path / "p.npz")
    with np.load(path, allow_pickle=False) as z:  # readable without pickle
        assert json.loads(str(z["meta"]))["table_sizes"] == SIZES
    q = AccessProfile.load(path)
    assert (
        q.feature_names == NAMES
        and q.table_sizes == SIZES
        and q.inputs == 50
        and q.sample_rate == 0.05
    )
    for a, b in zip(p.counts, q.counts):
        assert np.array_equal(a, b)
    assert np.array_equal(p.sample_lengths, q.sample_lengths) and np.array_equal(
        p.sample_values, q.sample_values
    )


def test_bad_ids_and_bad_files_give_one_line(tmp_path):
    prof = AccessProfiler(SIZES, NAMES)
    with pytest.raises(ProfileError, match="feature f1: id 5 outside the table's 5 rows"):
        prof.add_rows(np.array([[0, 5, 0]]))
    with pytest.raises(ProfileError, match="ids must be integers"):
        prof.add_indices(0, np.array([0.5]))
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip")
    with pytest.raises(ProfileError, match="not a readable access profile"):
        AccessProfile.load(junk)
    with pytest.raises(ProfileError, match="no such profile file"):
        AccessProfile.load(tmp_path / "missing.npz")


def test_summary_shares_and_zipf_fit():
    counts = np.zeros(100, np.int64)
    counts[7] = 50  # hottest row is not row 0
    counts[:40] += 1
    p = AccessProfile(["f"], [100], [counts], inputs=90)
    s = p.table_summary(0)
    assert s["rows_seen"] == 40 and s["lookups"] == 90
    assert s["top1pct_share"] == pytest.approx(51 / 90)  # 1 row of 100
    assert s["top10pct_share"] == pytest.approx((51 + 9) / 90)
    assert s["max_over_median"] == pytest.approx(51.0)
    # a Zipf(1.05) sample over 20k rows: the fitted exponent is close to the planted one
    rng = np.random.default_rng(0)
    n, alpha = 20_000, 1.05
    w = 1.0 / np.arange(1, n + 1) ** alpha
    ids = rng.choice(n, size=400_000, p=w / w.sum())
    fitted = fit_zipf(np.sort(np.bincount(ids, minlength=n))[::-1])
    assert abs(fitted - alpha) < 0.15


def test_cli_profiles_npy_files_and_plots(tmp_path, capsys):
    rng = np.random.default_rng(2)
    ids = np.stack([rng.integers(0, n, 400) for n in SIZES], 1).astype(np.int32)
    data = tmp_path / "data"  # an input directory: nothing is written inside it
    data.mkdir()
    np.save(data / "day_0.sparse.npy", ids)
    (data / "meta.json").write_text(json.dumps({"table_sizes": SIZES, "feature_names": NAMES}))
    out, png = tmp_path / "prof.npz", tmp_path / "cdf.png"
    assert (
        main([str(data), "--profile-sample-rate", "1", "--out", str(out), "--plot", str(png)]) == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["inputs"] == 400 and [t["lookups"] for t in summary["tables"]] == [400] * 3
    assert png.read_bytes()[:4] == b"\x89PNG"
    p = AccessProfile.load(out)
    assert np.array_equal(p.counts[2], np.bincount(ids[:, 2], minlength=200))
    # a saved profile is summarised again; a bad rate is one line, exit 2
    assert main([str(out)]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main([str(out), "--profile-sample-rate", "2"])
    assert e.value.code == 2
    assert main([str(tmp_path / "nothing.npy")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_cli_write_targets_are_checked_before_profiling_and_damage_is_one_line(tmp_path, capsys):
    ids = tmp_path / "day_0.sparse.npy"
    np.save(ids, np.zeros((10, 3), dtype=np.int32))
    a_file = tmp_path / "taken"
    a_file.write_text("mine")
    for flag, target, said in [
        ("--out", a_file / "p.npz", f"{a_file / 'p.npz'} cannot be created: {a_file} is a file"),
        ("--plot", tmp_path, f"{tmp_path} is a directory; expected the name of a profile plot PNG"),
    ]:
        with pytest.raises(SystemExit) as e:
            main([str(ids), flag, str(target)])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and err == f"python -m embeddings.profile: error: {flag}: {said}"
    assert a_file.read_text() == "mine"
    raw = bytearray(ids.read_bytes())
    raw[:8] = b"garbage!"  # no .npy magic: numpy would take it for a pickle
    ids.write_bytes(bytes(raw))
    assert main([str(ids)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pickle" not in err and f"{ids}: not a readable" in err


def test_the_plot_tells_criteos_26_tables_apart():
    from embeddings.profile import line_look

    looks = [line_look(t) for t in range(40)]
    assert len(set(looks)) == 40 and line_look(0) == ("C0", "-")


def test_an_interrupted_plot_leaves_no_half_png_and_the_old_one_whole(tmp_path, monkeypatch):
    """Ctrl-C (or a full disk) while the PNG is written: the plot goes to a temporary published
    at the end, so an earlier plot at the same path stays whole and no temporary is left."""
    import matplotlib.figure

    rng = np.random.default_rng(3)
    counts = [np.bincount(rng.integers(0, n, 100), minlength=n) for n in SIZES]
    profile = AccessProfile(NAMES, SIZES, counts, inputs=100)
    png = tmp_path / "cdf.png"
    profile.plot(png)
    before = png.read_bytes()

    def interrupted(self, f, **kwargs):
        f.write(b"\x89PNG half")
        raise KeyboardInterrupt

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", interrupted)
    with pytest.raises(KeyboardInterrupt):
        profile.plot(png)
    assert png.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cdf.png"]
