"""What a run says while and after it trains, as a batch job sees it: progress lines on a
piped stdout, the summary naming what was decided, and Ctrl-C's one line with the command that
resumes (exit 130, no traceback, no damaged checkpoint)."""

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlrm.checkpoints import format as ckpt
from dlrm.checkpoints import store as checkpoint_store
from dlrm.progress import duration, wanted_lines
from dlrm.train import config_from_args
from dlrm.trainer import Trainer

TINY = ["--arch-embedding-size", "30-20-10", "--arch-sparse-feature-size", "4", "--arch-mlp-bot",
        "13-8-4", "--arch-mlp-top", "8-1", "--mini-batch-size", "32", "--test-data-size", "256"]  # fmt: skip


def train(*args, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dlrm.train", *TINY, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw,
    )  # fmt: skip


def test_a_piped_stdout_gets_a_line_every_print_freq_steps(tmp_path):
    run = tmp_path / "r"
    p = train("--data-size", str(32 * 30), "--print-freq", "7", "--placement", "auto",
              "--out-dir", str(run))  # fmt: skip
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    lines = out.splitlines()
    progress = [x for x in lines if x.startswith("step ")]
    assert [x.split()[1] for x in progress] == ["7/30", "14/30", "21/30", "28/30"]
    assert all(" epoch 1/1 " in x and " samples/s " in x and " ETA " in x for x in progress)
    assert "loss " in progress[0] and "train:" not in err  # no bar: stderr is no terminal
    # the summary: after the lines, what auto picked, no line for what the run did not use
    assert lines.index(progress[-1]) < next(i for i, x in enumerate(lines) if "test AUC" in x)
    assert "placement: device (picked by --placement auto)" in out
    assert "slipstream" not in out and "SSD tier" not in out and "inference" not in out
    s = json.loads((run / "summary.json").read_text())
    assert s["placement"]["requested"] == "auto" and s["placement"]["kind"] == "device"
    assert s["throughput"]["steady_samples"] == 32 * (30 - 3)  # the warm-up's 3 steps left out
    assert s["train_samples_per_s"] == s["throughput"]["steady_samples_per_s"]
    assert not {"slipstream", "ssd_tier", "inference"} & set(s)
    assert "in the steady state (fp32, cpu)" in out and "time: data " in out


def test_progress_setting_and_durations():
    class Tty:
        def isatty(self):
            return True

    assert wanted_lines(None, Tty()) is False and wanted_lines(False, sys.stdout) is False
    assert wanted_lines(None, open(__file__)) is True  # a file: a batch job's log
    assert [duration(s) for s in (0.4, 42, 185, 3720)] == ["0s", "42s", "3m05s", "1h02m"]


@pytest.mark.parametrize(
    "sig,code,how",
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated (SIGTERM)")],
    ids=["SIGINT", "SIGTERM"],
)
def test_ctrl_c_says_where_the_last_checkpoint_is_and_how_to_resume(tmp_path, sig, code, how):
    """Ctrl-C, and SIGTERM (what a batch scheduler sends) alike: one line, the checkpoint, the
    resume command, then the signal's exit code (128 + its number)."""
    run = tmp_path / "r"
    args = ["--data-size", str(32 * 5000), "--test-freq", "100", "--test-data-size", "64",
            "--print-freq", "0", "--out-dir", str(run)]  # fmt: skip
    p = train(*args)
    deadline = time.monotonic() + 240
    while not ckpt.list_checkpoints(run / "checkpoints") and time.monotonic() < deadline:
        assert p.poll() is None, p.communicate()
        time.sleep(0.05)
    p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    assert p.returncode == code, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith(f"{how}; the last checkpoint is ")
    found = ckpt.list_checkpoints(run / "checkpoints")
    named = Path(line.split("the last checkpoint is ")[1].split(";")[0])
    assert named == found[-1]
    # no temporary left beside the checkpoints, and each one verifies
    assert sorted(x.name for x in (run / "checkpoints").iterdir()) == [x.name for x in found]
    for c in found:
        checkpoint_store.read(c)
    command = shlex.split(line.split("resume with: ")[1])
    assert command[:3] == ["python", "-m", "dlrm.train"]
    cfg = config_from_args(command[3:])
    assert cfg.resume == "auto" and Path(cfg.out_dir) == run
    assert (
        checkpoint_store.resume_target(cfg.resume, cfg.run_dir)[0] == named
    )  # it resumes from that one


def test_ctrl_c_while_a_checkpoint_is_written_leaves_the_earlier_ones_whole(
    make_config, monkeypatch
):
    cfg = make_config(test_freq=5, keep_checkpoints=5)
    trainer = Trainer(cfg)
    real, calls = ckpt.torch.save, []

    def interrupted_save(obj, f, *a, **kw):
        calls.append(1)
        if len(calls) == 2:  # the second checkpoint: half written, then Ctrl-C
            f.write(b"PK\x03\x04 half a zip")
            raise KeyboardInterrupt
        return real(obj, f, *a, **kw)

    monkeypatch.setattr(ckpt.torch, "save", interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    directory = Path(cfg.out_dir) / "checkpoints"
    assert sorted(x.name for x in directory.iterdir()) == ["step_000000005.pt"]
    assert ckpt.load(directory / "step_000000005.pt")["train_state"]["step"] == 5


def test_the_summary_names_the_capabilities_the_run_used(make_config, tmp_path):
    """The SSD tier's part comes from its store and Slipstream's from its pipeline; a run
    shorter than Slipstream's warm-up says so; an --inference-only run says whether it
    quantized."""
    from dlrm.summary_text import summary_lines

    cfg = make_config(placement="tiered", hot_budget="2KB", profile_sample_rate=0.2,
                      scm_cache="2KB", scm_io="buffered", scm_dir=str(tmp_path / "scm"),
                      slipstream=True, slipstream_warmup=100, data_size=64 * 12)  # fmt: skip
    s = Trainer(cfg).fit()
    assert s["ssd_tier"]["cache_hit_rate"] == s["placement"]["scm_cache_hit_rate"] is not None
    assert s["ssd_tier"]["rows_read"] == s["placement"]["scm_rows_read"]
    sl = s["slipstream"]
    assert sl["shorter_than_warmup"] and sl["steps"] == 12 and sl["samples_skipped"] == 0
    text = "\n".join(summary_lines(s, cfg.out_dir))
    assert "placement: tiered, " in text and " hot rows" in text
    assert "slipstream: nothing skipped: the run (12 steps) was shorter than the warm-up " in text
    assert f"SSD tier: row cache hit rate {100 * s['ssd_tier']['cache_hit_rate']:.1f}%" in text
    assert "inference" not in s and "inference" not in text

    model = tmp_path / "m.pt"
    Trainer(make_config(save_model=str(model), data_size=64 * 4, out_dir=str(tmp_path / "a"))).fit()
    for bits, said in ((8, "inference: quantized (embeddings 8-bit, MLPs 32-bit"),
                       (32, "inference: not quantized")):  # fmt: skip
        q = make_config(inference_only=True, load_model=str(model), quantize_emb_with_bit=bits,
                        out_dir=str(tmp_path / f"q{bits}"))  # fmt: skip
        s = Trainer(q).fit()
        assert s["inference"]["quantized"] == (bits != 32)
        text = "\n".join(summary_lines(s, q.out_dir))
        assert said in text and "trained" not in text


def test_ctrl_c_while_the_run_preprocesses_is_one_line(tmp_path):
    """Issue 46: Ctrl-C reaches the preprocessing workers too (the terminal's process group);
    they printed their own tracebacks before the run's line. Now only the run speaks."""
    import os

    from data_pipeline.synthetic_raw import SyntheticSpec, write_kaggle

    write_kaggle(tmp_path / "raw", 250_000, 0, SyntheticSpec(seed=1, vocab_cap=1000))
    run = tmp_path / "r"
    p = subprocess.Popen(
        [sys.executable, "-m", "dlrm.train", "--data-set", "kaggle", "--raw-data-file",
         str(tmp_path / "raw/train.txt"), "--processed-data-file", str(tmp_path / "pp"),
         "--max-ind-range", "1000", *TINY[2:], "--out-dir", str(run), "--progress", "false"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    while (line := p.stderr.readline()) and not line.startswith("preprocessing kaggle"):
        pass
    assert line, p.communicate()
    time.sleep(0.5)  # the workers are parsing blocks
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines() == [
        f"interrupted before the first checkpoint; nothing to resume in {run}"
    ]


@pytest.mark.usefixtures("one_thread")
def test_a_large_checkpoint_is_said_when_it_starts_and_ends(tmp_path, monkeypatch, capsys):
    """Writing Kaggle's 2.2 GB took 14 s with nothing printed (the walk of the pages); a checkpoint
    past the threshold says its size before and its time after, a small one nothing."""
    import dlrm.trainer

    argv = [*TINY, "--data-size", "64", "--progress=false", "--print-freq", "0"]
    Trainer(config_from_args([*argv, "--out-dir", str(tmp_path / "small")])).fit()
    assert "checkpoint" not in capsys.readouterr().out
    monkeypatch.setattr(dlrm.trainer, "SAID_CHECKPOINT_BYTES", 1)
    Trainer(config_from_args([*argv, "--out-dir", str(tmp_path / "r")])).fit()
    said = [x for x in capsys.readouterr().out.splitlines() if "checkpoint" in x]
    path = tmp_path / "r" / "checkpoints" / "step_000000002.pt"
    assert said[0].startswith("step 2: writing a checkpoint of about ") and said[0].endswith("KiB")
    assert said[1].startswith("step 2: checkpoint written in ") and said[1].endswith(f" s ({path})")
    assert len(said) == 2


def test_a_long_part_of_the_run_says_how_far_it_is():
    """An evaluation of 8 batches of 16384 took 250 s with nothing printed (MLPerf DCNv2's small
    recipe on a loaded machine): a Ticker says how far it is every `every_s` seconds."""
    from dlrm.progress import Ticker

    said: list[str] = []
    quiet = Ticker("evaluating", 8, said.append)  # every 10 s: done within it, nothing said
    for i in range(8):
        quiet.tick(i)
    assert said == []
    ticker = Ticker("evaluating", 8, said.append, every_s=0.0)
    time.sleep(0.01)
    ticker.tick(3)
    assert len(said) == 1 and said[0].startswith("evaluating: 3/8 batches (38%), ETA "), said
    Ticker("evaluating", 8, None, every_s=0.0).tick(3)  # no say (a bar shows it): nothing
    assert len(said) == 1


def test_the_evaluation_ticks(monkeypatch, tmp_path):
    import dlrm.evaluation
    from dlrm.progress import Ticker

    monkeypatch.setattr(dlrm.evaluation, "Ticker", lambda *a: Ticker(*a, every_s=0.0))
    said: list[str] = []
    trainer = Trainer(
        config_from_args([*TINY, "--data-size", "64", "--out-dir", str(tmp_path / "r")])
    )
    dlrm.evaluation.evaluate(trainer.model, trainer.data.test, trainer.device, say=said.append)
    want = [f"evaluating: {i}/8 batches ({100 * i / 8:.0f}%)" for i in range(1, 9)]
    assert [x.split(",")[0] for x in said] == want
