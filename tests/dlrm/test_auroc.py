"""dlrm.metrics.binary_auroc, written out in place of torchmetrics' (whose import took a second
of every command's start), gives torchmetrics' area: ties at half credit, any order."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torchmetrics.functional.classification import binary_auroc as reference

from dlrm.metrics import binary_auroc, binary_metrics


def _cases():
    g = torch.Generator().manual_seed(0)
    labels = (torch.rand(20_000, generator=g) < 0.2).float()
    scores = torch.rand(20_000, generator=g) + 0.3 * labels
    yield "distinct", scores, labels
    yield "ties", (scores * 20).round() / 20, labels  # 27 distinct values: every group mixed
    yield "saturated", torch.sigmoid(40 * (scores - 0.6)), labels  # 0.0 and 1.0 ties
    yield "one each", torch.tensor([0.3, 0.7]), torch.tensor([0.0, 1.0])
    yield "reversed", torch.tensor([0.9, 0.8, 0.1]), torch.tensor([0.0, 0.0, 1.0])
    yield "all tied", torch.full((7,), 0.5), torch.tensor([0, 1, 0, 1, 1, 0, 0.0])


@pytest.mark.parametrize(
    "name,scores,labels", list(_cases()), ids=lambda x: x if isinstance(x, str) else ""
)
def test_the_area_is_torchmetrics(name, scores, labels):
    want = reference(scores, labels.long()).item()
    assert binary_auroc(scores, labels) == pytest.approx(want, abs=1e-6)


def test_the_area_in_the_evaluation_metrics():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5000, generator=g)
    labels = (torch.rand(5000, generator=g) < torch.sigmoid(logits)).float()
    got = binary_metrics(logits, labels)["auc"]
    assert got == pytest.approx(reference(torch.sigmoid(logits), labels.long()).item(), abs=1e-6)
    assert binary_auroc(torch.tensor([0.2, 0.4]), torch.tensor([1.0, 0.0])) == 0.0


def test_a_training_command_starts_without_importing_torchmetrics():
    code = "import sys, dlrm.train, dlrm.trainer; print([m for m in sys.modules if 'torchmetrics' in m])"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(root)})  # fmt: skip
    assert (out.returncode, out.stdout) == (0, "[]\n"), out.stderr
