"""The run directory and its seeds: where a run's files live and who may write there.

`rundir`: the guard every engine calls before writing (`check_owner`, `prepare`), the resolved
`recipe.yaml` and `environment.json`, atomic writes. `seeds`: one recipe over several seeds, each in
`<run dir>/seed-<k>/`, launched as child processes (`launch_seeds`) and found again (`seed_of_dir`).
"""
