"""The silenced third-party warnings are exactly the known-harmless ones (dlrm/processes/third_party.py)."""

import logging
import warnings

from dlrm.processes import third_party

FBGEMM = ("fbgemm::dense_embedding_codegen_lookup_function: an autograd kernel was not registered "
          "to the Autograd key(s) but we are trying to backprop through it.")  # fmt: skip


def shown(message: str, category, module: str) -> bool:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")  # what pytest's own filters would add: reset below
        warnings.resetwarnings()
        third_party._done = False
        third_party.silence_harmless()
        warnings.warn_explicit(message, category, f"/x/{module.replace('.', '/')}.py", 1,
                               module=module)  # fmt: skip
    return bool(seen)


def test_exactly_the_known_warnings_are_silenced(caplog):
    assert not shown(FBGEMM, UserWarning, "torch.autograd.graph")
    assert shown(FBGEMM, UserWarning, "somewhere.else")  # the same words from elsewhere: shown
    assert shown("fbgemm::other_op: an autograd kernel was not registered", UserWarning,
                 "torch.autograd.graph")  # another op: not known to be harmless  # fmt: skip
    assert not shown("`broadcast_buffers` is deprecated. Use ...", FutureWarning,
                     "torchrec.distributed.embeddingbag")  # fmt: skip
    with caplog.at_level(logging.WARNING):
        logging.getLogger("torchrec.distributed.utils").warning(
            "Sharding Type is data_parallel, caching params will be ignored"
        )
        logging.getLogger("torchrec.distributed.utils").warning("something else")
        logging.warning("Sharding spec not found for .t_cat_0")  # not from torchrec's planner
    assert [r.getMessage() for r in caplog.records] == [
        "something else", "Sharding spec not found for .t_cat_0",
    ]  # fmt: skip
