"""Placement and planning: where every embedding row of a run lives, and why.

- `build_collection`: from `--placement` to an embedding collection (and FAE's schedule);
- `run_plan`: the access profile and placement plan a run uses (made or reused, saved);
- `tiered_setup`: `--placement tiered`'s plan, SSD-tier settings and collection;
- `memory_check`: what a run needs per tier against what this process may use;
- `kinds`: the placement kinds' contract and registry (`builtin_kinds`: device, host, fae,
  hotline, tiered);
- `auto`: `--placement auto`, the planner (`Planner`): candidates weighed by predicted step time;
- `enumerator`: the planner's candidates, what they are weighed against, and no degenerate ones;
- `candidates`: the planner's contract (a candidate, typed time and memory breakdowns, the
  planning sample, who predicts);
- `auto_check`: the chosen placement's first steps measured against its prediction.
"""

from hybrid_dlrm.common.lazy import lazy_exports

_HOME = {
    "resolve_placement": "dlrm.placement.build_collection",
    "placement_needs": "dlrm.placement.build_collection",
    "placement_summary": "dlrm.placement.build_collection",
    "schedule_training_data": "dlrm.placement.build_collection",
    "PlacedEmbeddings": "dlrm.placement.run_plan",
    "obtain_plan": "dlrm.placement.run_plan",
    "obtain_profile": "dlrm.placement.run_plan",
    "PLAN_NAME": "dlrm.placement.run_plan",
    "PROFILE_NAME": "dlrm.placement.run_plan",
    "build_tiered": "dlrm.placement.tiered_setup",
    "tiered_needs": "dlrm.placement.tiered_setup",
    "check_memory": "dlrm.placement.memory_check",
    "Decision": "dlrm.placement.auto",
    "Planner": "dlrm.placement.auto",
    "resolve_auto": "dlrm.placement.auto",
    "Candidate": "dlrm.placement.candidates",
    "Prediction": "dlrm.placement.candidates",
    "StepTime": "dlrm.placement.candidates",
    "TierBytes": "dlrm.placement.candidates",
    "PlanningSample": "dlrm.placement.candidates",
    "KindPredictor": "dlrm.placement.candidates",
    "Enumerator": "dlrm.placement.enumerator",
    "CandidateSpace": "dlrm.placement.enumerator",
    "PlacementKind": "dlrm.placement.kinds",
    "placement_kind": "dlrm.placement.kinds",
    "MeasuredAgainstPredicted": "dlrm.placement.auto_check",
}

__all__ = sorted(_HOME)
__getattr__, __dir__ = lazy_exports(__name__, _HOME)
