"""The CPU mechanism study: FP8 over-clipping and the calibrator's response to it, over seeds,
with 95 % intervals, on the endpoints of `endpoints.yaml` (fixed after the committed runs were made:
the report says so).

`python -m nemo_fp8_rl.study` runs the study recipes (`recipes/study/`) over the seeds, a few
runs at a time, then writes the report (targets with Student-t intervals over seeds, plots,
settings); `--write-docs` writes the committed one in `docs/study/`. `grid` runs the recipes, `analysis` turns run directories into per-seed summaries
and intervals, `report` writes the Markdown and PNG files.
"""
