"""The memory inventory (embeddings/room.py) on fake /proc and cgroup files, and the check every
placement gets before any table is made (dlrm/placement/memory_check.py): one line naming both figures and the
settings that fit, the settings it names fitting, and `--scm-cache` capped at the rows."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from dlrm import compose
from dlrm.config import TrainConfig
from dlrm.errors import ConfigError
from dlrm.placement import memory_check as run_memory
from dlrm.train import main
from embeddings import SparseOptimizer, tables_for_features
from embeddings.hot_rows import parse_bytes, row_bytes
from embeddings.room import MemoryInventory, Needs, Room, cgroup_room, flag_bytes, host_room

GiB, MiB, KiB = 2**30, 2**20, 2**10


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _proc(root: Path, available_kib: int, rss_kib: int = 100_000, size_kib: int = 900_000) -> None:
    _write(root, "proc/meminfo", f"MemTotal: 99999999 kB\nMemAvailable: {available_kib} kB\n")
    _write(
        root, "proc/self/status", f"Name: python\nVmSize:\t{size_kib} kB\nVmRSS:\t{rss_kib} kB\n"
    )


def _cgroup_v2(root: Path, path: str, levels: dict[str, tuple[str, int, int]]) -> None:
    """`levels`: cgroup path -> (memory.max, memory.current, inactive_file)."""
    _write(root, "proc/self/cgroup", f"0::{path}\n")
    _write(root, "proc/self/mountinfo",
           "30 1 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")  # fmt: skip
    for where, (limit, current, inactive) in levels.items():
        d = f"sys/fs/cgroup{where}"
        _write(root, f"{d}/memory.max", f"{limit}\n")
        _write(root, f"{d}/memory.current", f"{current}\n")
        _write(root, f"{d}/memory.stat", f"anon 1\ninactive_file {inactive}\nactive_file 5\n")


def test_host_room_is_the_tightest_bound_cgroup_v2(tmp_path):
    _proc(tmp_path, available_kib=8 * 2**20)  # 8 GiB
    _cgroup_v2(tmp_path, "/user.slice/job", {
        "": ("max", 10 * GiB, 0),
        "/user.slice": ("max", GiB, 0),
        "/user.slice/job": (str(2 * GiB), 3 * GiB // 2, GiB // 2),  # usage 1.5 GiB, 0.5 inactive
    })  # fmt: skip
    room = host_room(root=tmp_path, address_limit=None)
    assert room == Room(GiB, "cgroup memory.max 2.0 GiB")  # 2 GiB - (1.5 - 0.5) GiB
    # an ancestor's limit binds too (the processes beside this one use it)
    _write(tmp_path, "sys/fs/cgroup/user.slice/memory.max", f"{GiB + GiB // 4}\n")
    assert host_room(root=tmp_path, address_limit=None).bytes == GiB // 4
    # --memory-limit: the limit minus what this process holds (VmRSS 100000 kB)
    room = host_room(200 * MiB, root=tmp_path, address_limit=None)
    assert room == Room(200 * MiB - 100_000 * KiB, "--memory-limit 200MiB")
    # ulimit -v: the address space left (VmSize 900000 kB mapped)
    room = host_room(root=tmp_path, address_limit=GiB)
    assert room == Room(GiB - 900_000 * KiB, "ulimit -v 1.0 GiB")


def test_host_room_cgroup_v1_and_meminfo(tmp_path):
    _proc(tmp_path, available_kib=3 * 2**20)
    _write(tmp_path, "proc/self/cgroup", "5:cpu:/\n4:memory:/process_api/abc\n0::/\n")
    _write(tmp_path, "proc/self/mountinfo",
           "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
           "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
           "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")  # fmt: skip
    base = "sys/fs/cgroup/memory"
    for d, limit, usage in ((base, 9223372036854771712, 20 * GiB),  # no limit (v1's spelling)
                            (f"{base}/process_api", 9223372036854771712, 2 * GiB),
                            (f"{base}/process_api/abc", 5 * GiB, 2 * GiB)):  # fmt: skip
        _write(tmp_path, f"{d}/memory.limit_in_bytes", f"{limit}\n")
        _write(tmp_path, f"{d}/memory.usage_in_bytes", f"{usage}\n")
        _write(tmp_path, f"{d}/memory.stat", f"cache 1\ntotal_inactive_file {GiB}\n")
    assert cgroup_room(tmp_path) == Room(4 * GiB, "cgroup memory.limit_in_bytes 5.0 GiB")
    # MemAvailable (3 GiB) is tighter than the cgroup (4 GiB)
    assert host_room(root=tmp_path, address_limit=None) == Room(3 * GiB, "MemAvailable")


def test_container_cgroup_outside_the_mount_reads_the_mount_itself(tmp_path):
    _proc(tmp_path, available_kib=64 * 2**20)
    _write(tmp_path, "proc/self/cgroup", "0::/\n")  # a cgroup namespace: the mount is its own
    _write(tmp_path, "proc/self/mountinfo",
           "30 1 0:26 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n")  # fmt: skip
    _write(tmp_path, "sys/fs/cgroup/memory.max", f"{4 * GiB}\n")
    _write(tmp_path, "sys/fs/cgroup/memory.current", f"{GiB}\n")
    assert host_room(root=tmp_path, address_limit=None).bytes == 3 * GiB
    # no memory controller at all: MemAvailable alone
    (tmp_path / "proc/self/mountinfo").write_text("")
    assert host_room(root=tmp_path, address_limit=None) == Room(64 * GiB, "MemAvailable")


def test_flag_bytes_reads_back_no_larger():
    for n in (5 * MiB + 7, 900 * MiB, 7 * GiB + 123456789, 3 * 2**40 + 1):
        shown = flag_bytes(n)
        assert parse_bytes(shown) <= n and parse_bytes(shown) > 0.9 * n, shown


# --- the check ------------------------------------------------------------------------------------

TERABYTE = ["--arch-embedding-size", "-".join(["10000000"] * 26), "--arch-sparse-feature-size", "64",
            "--arch-mlp-bot", "13-512-256-64", "--arch-mlp-top", "512-512-256-1",
            "--data-size", "4096", "--test-data-size", "2048"]  # fmt: skip


@pytest.fixture
def no_tables(monkeypatch):
    """A run that got past the check would allocate here: the tests fail instead."""

    def refuse(*a, **k):
        raise AssertionError("a table was allocated before the memory check ended the run")

    monkeypatch.setattr(compose, "build_placed_embeddings", refuse)


def test_terabyte_tables_under_a_memory_limit_end_in_one_line(tmp_path, capsys, no_tables):
    rc = main(TERABYTE + ["--memory-limit", "24GB", "--out-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    # both figures, what they are made of, and the settings that fit
    assert re.search(r"--placement device: needs 6\d\.\d GiB of host DRAM \(tables \+ optimizer "
                     r"state 62\.0 GiB, activations at batch 2048 [\d.]+ MiB", err), err  # fmt: skip
    assert re.search(
        r"but this process may use [\d.]+ GiB \((--memory-limit 24GiB|MemAvailable|cgroup)", err
    )
    # the tiered suggestion needs the tier's whole file (66.1 GiB) free on the run's disk; on a
    # machine with less, the line says the disk is what is short (both are the check's answers)
    if shutil.disk_usage(tmp_path).free > 68 * 2**30:
        assert (
            "settings that fit: --placement tiered --hot-budget " in err and "--scm-dir DIR" in err
        )
    else:
        assert "settings that fit:" in err or "no placement fits: use " in err, err


def _tiny(tmp_path, **kw) -> TrainConfig:
    base = dict(
        arch_embedding_size=(20_000,) * 6, arch_sparse_feature_size=16,
        arch_mlp_bot=(13, 16), arch_mlp_top=(16, 1), mini_batch_size=64, data_size=64 * 3,
        test_data_size=128, out_dir=str(tmp_path / "run"), progress=False, num_batches=3,
    )  # fmt: skip
    base.update(kw)
    return TrainConfig(**base)


def _machine(monkeypatch, host: int, disk: int | None = None) -> None:
    """This process may use `host` bytes of DRAM (and `disk` under --scm-dir), whatever the
    machine has: the check and the settings it suggests are judged against that."""

    def fake(device, memory_limit=None, device_memory_limit=None, disk_dir=None):
        room = Room(disk if disk is not None else 2**50, "disk") if disk_dir else None
        return MemoryInventory(None, Room(host, "test machine"), room)

    monkeypatch.setattr(run_memory, "inventory", fake)
    monkeypatch.setattr("embeddings.room.disk_room", lambda d: Room(2**50, "disk"))


def test_the_settings_the_line_names_fit_and_train(tmp_path, monkeypatch):
    """6 x 20000 rows of 16 floats = 7.3 MiB of tables on a 'machine' with 6 MiB: the check names
    the tiered placement with budgets that fit; that run passes the check and trains."""
    from dlrm.trainer import Trainer

    _machine(monkeypatch, 6 * MiB)
    with pytest.raises(ConfigError) as e:
        Trainer(_tiny(tmp_path))
    line = str(e.value)
    assert "--placement device: needs 7." in line and "may use 6.0 MiB (test machine)" in line
    m = re.search(r"--placement tiered --hot-budget (\S+) --scm-cache (\S+) --scm-dir DIR", line)
    assert m, line
    hot, cache = m.groups()
    cfg = _tiny(tmp_path, placement="tiered", hot_budget=hot, scm_cache=cache,
                scm_dir=str(tmp_path / "scm"), out_dir=str(tmp_path / "run2"))  # fmt: skip
    needs, room = run_memory.check_memory(
        cfg, compose.build_data(cfg), compose.resolve_device("cpu")
    )
    assert needs.device_on_host().on("host") <= room.host.bytes
    trainer = Trainer(cfg)
    assert trainer.placement.kind == "tiered" and trainer.fit()["steps"] == 3


def test_a_configuration_that_fits_runs(tmp_path, capsys):
    from tests.dlrm.test_cli import TINY

    assert main(TINY + ["--memory-limit", "64GB", "--num-batches", "2",
                        "--out-dir", str(tmp_path / "r")]) == 0  # fmt: skip


def test_max_ind_range_named_is_the_largest_that_fits_to_two_digits():
    cfg = TrainConfig(data_set="terabyte", raw_data_file="day", progress=False)
    tables = tables_for_features([10_000_000] * 26, 64, [f"cat_{i}" for i in range(26)])
    base = Needs().add("host", "dense part", 50 * MiB)
    room = MemoryInventory(None, Room(20 * GiB, "test"), None)
    m = run_memory._max_ind_range(cfg, tables, base, room, on_cpu=True)
    assert m is not None and len(str(m).rstrip("0")) <= 2

    def need(rows: int) -> int:
        return 26 * rows * row_bytes(64, SparseOptimizer("sgd")) + 50 * MiB

    assert need(m) <= 20 * GiB < need(int(m * 1.12))


def test_scm_cache_larger_than_the_rows_is_capped(tmp_path):
    """`--scm-cache 5TB` with 483 KB of tables trains, its cache the tier's rows, no more."""
    from dlrm.trainer import Trainer

    cfg = _tiny(tmp_path, arch_embedding_size=(3000, 2000, 2000, 500), placement="tiered",
                hot_budget="64KB", scm_cache="5TB")  # fmt: skip
    trainer = Trainer(cfg)
    coll = trainer.model.embeddings
    rows = sum(t.num_embeddings for t in coll.tables) - coll.num_hot
    rb = row_bytes(16, SparseOptimizer("sgd"))
    assert 7500 * rb < 483 * KiB and coll.placement_info()["scm_cache_bytes"] == rows * rb


def test_a_cache_larger_than_the_machine_is_one_line(tmp_path, monkeypatch):
    _machine(monkeypatch, 4 * MiB)
    cfg = _tiny(tmp_path, placement="tiered", hot_budget="1MB", scm_cache="5TB")
    with pytest.raises(ConfigError) as e:
        run_memory.check_memory(cfg, compose.build_data(cfg), compose.resolve_device("cpu"))
    line = str(e.value)
    assert "\n" not in line and "--placement tiered: needs " in line
    # the cache counted as the rows it can hold (7.3 MiB of tables less the hot MiB), not 5 TB
    assert re.search(r"SSD tier row cache \(--scm-cache 6\.\d MiB\) 6\.\d MiB", line), line
    # its own kind's suggestion spells what changes: the cache the planner would give it
    assert re.search(r"settings that fit: (--hot-budget \S+ )?--scm-cache \d+KiB$", line), line


def test_cuda_memory_short_names_the_placements_that_fit(tmp_path, monkeypatch):
    """The device tier on CUDA (an inventory with a device room; no GPU needed to judge it):
    4 x 1M rows of 64 floats (977 MiB) on a 'device' with 512 MiB and a host with 8 GiB."""

    def fake(device, memory_limit=None, device_memory_limit=None, disk_dir=None):
        disk = Room(2**50, "disk") if disk_dir else None
        return MemoryInventory(Room(512 * MiB, "--device-memory-limit 512MiB"),
                               Room(8 * GiB, "test machine"), disk)  # fmt: skip

    monkeypatch.setattr(run_memory, "inventory", fake)
    monkeypatch.setattr("embeddings.room.disk_room", lambda d: Room(2**50, "disk"))
    cfg = _tiny(tmp_path, arch_embedding_size=(1_000_000,) * 4, arch_sparse_feature_size=64,
                arch_mlp_bot=(13, 64), arch_mlp_top=(64, 1))  # fmt: skip
    data, cpu = compose.build_data(cfg), compose.resolve_device("cpu")
    with pytest.raises(ConfigError) as e:
        run_memory.check_memory(cfg, data, cpu)
    line = str(e.value)
    assert (
        "--placement device: needs 97" in line and " MiB of CUDA memory (tables + optimizer" in line
    )
    assert "but this process may use 512.0 MiB (--device-memory-limit 512MiB)" in line
    # every kind's first candidate of the planner's enumerator that fits, in the registry's order
    assert re.search(r"settings that fit: --placement host, or --placement fae --hot-budget \d+MiB, "
                     r"or --placement hotline --hot-budget \d+MiB, or --placement tiered "
                     r"--hot-budget \d+MiB --scm-cache \d+MiB --scm-dir DIR", line), line  # fmt: skip
    for fix in (dict(placement="host"), dict(placement="fae", hot_budget="200MB")):
        needs, room = run_memory.check_memory(
            _tiny(tmp_path, **{**cfg.to_json(), **fix}), data, cpu
        )
        assert needs.on("device") <= room.device.bytes and needs.on("host") <= room.host.bytes
    with pytest.raises(ConfigError, match=r"--placement fae: needs .* of CUDA memory .* settings "
                                          r"that fit: --hot-budget \d+MiB, or --placement host, or"):  # fmt: skip
        run_memory.check_memory(_tiny(tmp_path, **{**cfg.to_json(), "placement": "fae",
                                                   "hot_budget": "1GB"}), data, cpu)  # fmt: skip


def test_a_dense_part_too_large_is_refused_before_it_is_allocated(tmp_path, capsys):
    """A DCN of rank 1e8 (1.9 TiB of cross weights): one line naming the dense part, before any
    of it is allocated (the count is taken on the meta device)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    argv = ["--arch-interaction-op", "dcn", "--dcn-low-rank-dim", "100000000", "--out-dir",
            str(tmp_path / "r")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "(dense part 1.9 TiB," in err, err
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 2 * 2**20, grown_kib  # far below any share of the terabytes
