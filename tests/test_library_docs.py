"""docs/library.md's code runs as written: every ```python block, in order, in one namespace,
in a fresh directory (the sizes on the page are already small)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

PAGE = Path(__file__).resolve().parents[1] / "docs" / "library.md"


@pytest.mark.usefixtures("long_training")
def test_every_python_block_of_the_library_page_runs(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    assert len(blocks) == 4
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small steps: extra threads only wait on a shared machine
    namespace: dict = {"__name__": "library_docs"}
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, f"docs/library.md block {i + 1}", "exec"), namespace)
    finally:
        torch.set_num_threads(threads)
    # the own-data example learned its planted rule (the parity of table a's id)
    assert namespace["summary"]["test_auc"] > 0.9, namespace["summary"]["test_auc"]
    assert namespace["probabilities"].shape == (512,)
    assert namespace["batch"].labels.shape == (256,)  # the last block's, the synthetic source's
    assert (tmp_path / "runs" / "own-data" / "summary.json").is_file()


def test_from_batches_says_what_is_wrong_in_one_line():
    import pytest

    from dlrm import ConfigError, DataSplits

    namespace: dict = {"__name__": "library_docs"}
    block = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)[1]
    exec(block.split("data = DataSplits")[0], namespace)  # the page's my_batch
    my_batch = namespace["my_batch"]
    with pytest.raises(ConfigError, match=r"^table_sizes: 1 sizes for 2 sparse features \(a, b\)$"):
        DataSplits.from_batches(train=[my_batch(4, 0)], test=[my_batch(4, 1)], table_sizes=[9])
    with pytest.raises(ConfigError, match="^test: no batches$"):
        DataSplits.from_batches(train=[my_batch(4, 0)], test=[], table_sizes=[9, 9])
    with pytest.raises(ConfigError, match="^train: expected torchrec Batch items, got tuple$"):
        DataSplits.from_batches(train=[(1, 2)], test=[my_batch(4, 1)], table_sizes=[9, 9])
