"""Reading finished runs and judging them: run metrics (`rundata`), seed statistics (`stats`),
entropy-surge detection (`surge`), the two-run and seed-group comparisons (`compare`, `groups`),
and their reports (`report`, `report_groups`, rendered with `render`).

Nothing here imports torch or a training engine: `compare` runs on a laptop over copied run folders.
"""
