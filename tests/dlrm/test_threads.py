"""The thread count a run chooses (affinity, cgroup CPU quota, the environment, --threads), the
wait policy it sets before OpenMP starts, and that a run given --threads computes on that many."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dlrm.errors import ConfigError
from dlrm.processes import threads
from dlrm.train import config_from_args, main

ROOT = Path(__file__).resolve().parents[2]


def fake_cgroup(tmp_path, groups: str, mounts: list[tuple[str, str, str, str]], files: dict):
    """/proc/self/cgroup and /proc/self/mountinfo as given, with cgroup files under tmp_path.
    mounts: (cgroup root, mount point under tmp_path, fstype, super options)."""
    lines = [
        f"{30 + i} 23 0:{40 + i} {root} {tmp_path / point} rw,relatime - {fstype} cgroup {opts}"
        for i, (root, point, fstype, opts) in enumerate(mounts)
    ]
    lines.insert(0, "22 1 8:1 / / rw,relatime - ext4 /dev/vda rw")  # not a cgroup: skipped
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    for _, point, _, _ in mounts:
        (tmp_path / point).mkdir(parents=True, exist_ok=True)
    (tmp_path / "cgroup").write_text(groups)
    (tmp_path / "mountinfo").write_text("\n".join(lines) + "\n")
    return threads.cpu_quota(tmp_path / "cgroup", tmp_path / "mountinfo")


V2 = [("/", "cg", "cgroup2", "rw,nsdelegate")]


def test_cgroup_v2_quota_of_the_process_group(tmp_path):
    files = {"cg/job.slice/run/cpu.max": "150000 100000\n", "cg/cpu.max": "max 100000\n"}
    assert fake_cgroup(tmp_path, "0::/job.slice/run\n", V2, files) == 1.5


def test_cgroup_v2_a_parent_quota_limits_its_children(tmp_path):
    files = {"cg/job.slice/run/cpu.max": "max 100000\n", "cg/job.slice/cpu.max": "50000 25000"}
    assert fake_cgroup(tmp_path, "0::/job.slice/run\n", V2, files) == 2.0


def test_cgroup_v2_without_a_quota(tmp_path):
    files = {"cg/run/cpu.max": "max 100000\n"}
    assert fake_cgroup(tmp_path, "0::/run\n", V2, files) is None


def test_cgroup_v2_namespaced_process_reads_the_mount_root(tmp_path):
    # inside a cgroup namespace the process's path is "/" and its group is the mount itself
    assert fake_cgroup(tmp_path, "0::/\n", V2, {"cg/cpu.max": "300000 100000"}) == 3.0


def test_cgroup_v1_quota_in_a_container_without_cgroup_namespace(tmp_path):
    # docker without a cgroup namespace: the path names the container, the mount is its group
    mounts = [("/docker/abc", "cpu", "cgroup", "rw,cpu,cpuacct"),
              ("/docker/abc", "mem", "cgroup", "rw,memory")]  # fmt: skip
    groups = "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n"
    files = {"cpu/cpu.cfs_quota_us": "250000\n", "cpu/cpu.cfs_period_us": "100000\n",
             "mem/cpu.cfs_quota_us": "1\n", "mem/cpu.cfs_period_us": "100000\n"}  # fmt: skip
    assert fake_cgroup(tmp_path, groups, mounts, files) == 2.5


def test_cgroup_v1_unlimited_and_unreadable(tmp_path):
    mounts = [("/", "cpu", "cgroup", "rw,cpu")]
    files = {"cpu/a/cpu.cfs_quota_us": "-1\n", "cpu/a/cpu.cfs_period_us": "100000\n"}
    assert fake_cgroup(tmp_path, "4:cpu:/a\n", mounts, files) is None
    assert fake_cgroup(tmp_path, "4:cpu:/a\n", mounts, {"cpu/a/cpu.cfs_quota_us": "x"}) is None
    assert threads.cpu_quota(tmp_path / "none", tmp_path / "none") is None


def test_quota_rounds_down_to_whole_cpus_and_never_below_one():
    assert threads.usable_cpus(affinity=2, quota=1.5) == 1  # a team over quota stalls whole
    assert threads.usable_cpus(affinity=2, quota=0.5) == 1
    assert threads.usable_cpus(affinity=8, quota=2.0) == 2
    assert threads.usable_cpus(affinity=2, quota=3.0) == 2  # affinity narrower than the quota
    assert threads.usable_cpus(affinity=3, quota=None) == 3


def test_auto_choice_and_its_one_line():
    c = threads.choose(0, environ={}, affinity=2, quota=1.5, wait="OpenMP's default wait")
    assert c.threads == 1 and c.follows_load
    assert c.describe() == "threads 1 from affinity 2 / quota 1.5; OpenMP's default wait"
    c = threads.choose(0, environ={}, affinity=2, quota=None)
    assert c.describe(now=1, others=0.96) == (
        "threads 1 of 2 from affinity 2 / quota none, following the load "
        "(others keep 1.0 CPUs busy)"
    )
    c = threads.choose(0, environ={}, affinity=1, quota=None)  # affinity narrower than nproc
    assert (c.threads, c.describe()) == (1, "threads 1 from affinity 1 / quota none")
    c = threads.choose(5, environ={"OMP_NUM_THREADS": "2"}, affinity=2, quota=None)
    assert (c.threads, c.describe()) == (5, "threads 5 from --threads 5 (affinity 2 / quota none)")
    assert not c.follows_load  # the user's count
    c = threads.choose(0, environ={"OMP_NUM_THREADS": "3"}, affinity=2, quota=None)
    assert (c.threads, c.source) == (3, "OMP_NUM_THREADS=3") and not c.follows_load
    c = threads.choose(0, environ={"LOCAL_WORLD_SIZE": "2"}, affinity=4, quota=None)
    assert (c.threads, c.source) == (2, "affinity 4 / quota none / 2 processes")
    assert not c.follows_load  # its siblings would read as a busy machine
    assert threads.choose(0, environ={"LOCAL_WORLD_SIZE": "4"}, affinity=2, quota=None).threads == 1


def test_auto_reads_this_process_affinity():
    """A process restricted to one CPU chooses one thread (no torch needed to choose)."""
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from dlrm.processes import threads; print(threads.choose(0, environ={}, quota=None).threads)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"


def test_wait_policy_is_the_users_where_given_else_openmps_own():
    env = {}
    assert threads.wait_policy(env) == "OpenMP's default wait"
    assert (
        env == {}
    )  # nothing set: the count follows the load instead (dlrm/processes/thread_watch.py)
    for name, value in (("OMP_WAIT_POLICY", "passive"), ("GOMP_SPINCOUNT", "300000")):
        env = {name: value}
        assert threads.wait_policy(env) == f"{name}={value}"
        assert env == {name: value}


def test_threads_flag_is_validated(capsys, tmp_path):
    assert config_from_args(["--threads", "3"]).threads == 3
    assert config_from_args([]).threads == 0
    most = threads.THREADS_MAX
    with pytest.raises(
        ConfigError, match=rf"^--threads: expected 0 \(auto\) to {most} .*, got -1$"
    ):
        config_from_args(["--threads", "-1"])
    assert main(["--threads", "-2", "--out-dir", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err == (
        f"python -m dlrm.train: error: --threads: expected 0 (auto) to {most} (4 per CPU of this "
        "machine), got -2\n"
    )


def test_a_run_given_threads_1_computes_on_one_thread(tmp_path):
    """In a fresh process (its own OpenMP runtime) where the environment asks for 4: torch's
    intra- and inter-op pools and numba's run 1 thread to the end of the run (the synthetic
    generator's numba loop resets OpenMP's count; it must not stay reset), and the run set the
    wait policy the user gave, or none."""
    code = (
        "import json, os, sys; from dlrm.train import main; rc = main(sys.argv[1:]); "
        "import numba, torch; print(json.dumps([rc, torch.get_num_threads(), "
        "torch.get_num_interop_threads(), numba.get_num_threads(), os.environ.get('OMP_WAIT_POLICY')]))"
    )
    tiny = ["--arch-embedding-size", "30-20-10", "--arch-sparse-feature-size", "4", "--arch-mlp-bot",
            "13-8-4", "--arch-mlp-top", "8-1", "--mini-batch-size", "32", "--data-size", "320",
            "--test-data-size", "256", "--progress", "false", "--out-dir", str(tmp_path / "r")]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in threads.WAIT_VARIABLES}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="4")
    out = subprocess.run([sys.executable, "-c", code, *tiny, "--threads", "1"], env=env,
                         capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == (
        f"threads 1 from --threads 1 (affinity {len(os.sched_getaffinity(0))} / quota "
        f"{threads._quota_text(threads.cpu_quota())}); OpenMP's default wait"
    )
    assert json.loads(lines[-1]) == [0, 1, 1, 1, None]


def test_an_automatic_count_follows_the_load_and_says_so(tmp_path):
    """Without --threads or OMP_NUM_THREADS the start line gives the count the load allows now,
    of the automatic choice, and what the others kept busy; the run trains."""
    tiny = ["--arch-embedding-size", "30-20-10", "--arch-sparse-feature-size", "4", "--arch-mlp-bot",
            "13-8-4", "--arch-mlp-top", "8-1", "--mini-batch-size", "32", "--data-size", "320",
            "--test-data-size", "256", "--progress", "false", "--out-dir", str(tmp_path / "r")]  # fmt: skip
    env = {k: v for k, v in os.environ.items()
           if k not in (*threads.WAIT_VARIABLES, "OMP_NUM_THREADS", "LOCAL_WORLD_SIZE")}  # fmt: skip
    env.update(PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "dlrm.train", *tiny], env=env,
                         capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr
    usable = threads.usable_cpus(len(os.sched_getaffinity(0)), threads.cpu_quota())
    first = out.stdout.splitlines()[0]
    m = re.fullmatch(
        rf"threads (\d+) of {usable} from affinity \d+ / quota \S+, following the load "
        r"\(others keep \d+\.\d CPUs busy\); OpenMP's default wait",
        first,
    )
    assert m and 1 <= int(m.group(1)) <= usable, first


@pytest.mark.parametrize("value", ["abc", "0", "-1", "1.5", "99999", " ,2"])
def test_an_omp_num_threads_that_cannot_be_the_count_is_refused_not_ignored(value):
    """The docs say OMP_NUM_THREADS fixes the count; libgomp itself ends the process with SIGSEGV
    at thousands, so the refusal comes before any OpenMP runtime starts."""
    with pytest.raises(ConfigError) as e:
        threads.choose(0, environ={"OMP_NUM_THREADS": value}, affinity=2, quota=None)
    assert str(e.value).startswith(f"OMP_NUM_THREADS={value.strip()}: expected a whole number")
    assert f"from 1 to {threads.THREADS_MAX}" in str(e.value)
    # unset or empty: the automatic count, as before
    assert threads.choose(0, environ={"OMP_NUM_THREADS": ""}, affinity=2, quota=None).follows_load


def test_a_thread_count_past_four_per_cpu_is_refused(capsys, tmp_path):
    too_many = threads.THREADS_MAX + 1
    assert main(["--threads", str(too_many), "--out-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"python -m dlrm.train: error: --threads: expected 0 (auto) to "
                   f"{threads.THREADS_MAX} (4 per CPU of this machine), got {too_many}")  # fmt: skip
