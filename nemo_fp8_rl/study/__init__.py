"""The CPU mechanism study: FP8 over-clipping and its fix, over seeds, with 95 % intervals.

`python -m nemo_fp8_rl.study` runs the study recipes (`recipes/study/`) over the seeds, one or
two runs at a time, then writes the report (table with bootstrap intervals, plots, settings) to
`docs/study/`. `grid` runs the recipes, `analysis` turns run directories into per-seed summaries
and intervals, `report` writes the Markdown and PNG files.
"""
