"""Seeds on Slurm: `submit --seeds` renders one job array (task id = seed), and on the real local
cluster (`scripts/local-slurm.sh up`) each task runs a complete 2-node Ray job for its seed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from tiny_fast import TWO_STEPS

from nemo_fp8_rl.cli import submit as submit_cli
from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.slurm import JobSpecError, array_tasks, build_job_spec, render_sbatch
from nemo_fp8_rl.slurm.render import array_range

RECIPE = "tiny/grpo-tiny-qwen3-cpu-fp8"
FAST = TWO_STEPS


@pytest.mark.parametrize(
    ("seeds", "text"), [((1,), "1"), ((1, 2, 3), "1-3"), ((0, 2, 3, 4, 9), "0,2-4,9")]
)
def test_array_range(seeds, text):
    assert array_range(seeds) == text


def test_array_script_sets_seed_and_run_dir_per_task(tmp_path):
    recipe = load_recipe(RECIPE, run_dir=tmp_path / "g")
    spec = build_job_spec(recipe, tmp_path / "g.yaml", flags={"seeds": [3, 1, 2, 7]})
    script = render_sbatch(spec)
    assert '#SBATCH --array="1-3,7"' in script
    assert f'#SBATCH --output="{tmp_path}/g/slurm/slurm-%A_%a.out"' in script
    assert "SEED_ARRAY=1" in script and f"RUN_DIR={tmp_path}/g\n" in script
    assert "RUN_DIR=$RUN_DIR/seed-$TRAIN_SEED" in script
    assert "SEED_KEYS=grpo.seed\n" in script  # the default: no key found to follow the seed
    assert '${TRAIN_RESUME:+"$TRAIN_RESUME"} $SEED_OVERRIDES' in script
    single = render_sbatch(build_job_spec(recipe, tmp_path / "g.yaml"))
    assert "--array" not in single and "SEED_ARRAY=''" in single


def test_seed_beyond_max_array_index_is_refused(tmp_path):
    recipe = load_recipe(RECIPE, run_dir=tmp_path / "g")
    with pytest.raises(JobSpecError, match="MaxArraySize"):
        build_job_spec(recipe, tmp_path / "g.yaml", flags={"seeds": [1, 5000]})


def test_array_resumes_per_seed_only(tmp_path):
    """An array's tasks resume through resume_seeds (seeds of the array), never all at once."""
    recipe = load_recipe(RECIPE, run_dir=tmp_path / "g")
    with pytest.raises(JobSpecError, match="a job array resumes per seed"):
        build_job_spec(recipe, tmp_path / "g.yaml", flags={"seeds": [1, 2], "resume": True})
    with pytest.raises(JobSpecError, match=r"resume_seeds: seed\(s\) 3 are not array tasks"):
        build_job_spec(recipe, tmp_path / "g.yaml", flags={"seeds": [1, 2], "resume_seeds": [3]})


def test_submit_seeds_dry_run_and_bad_input(capsys, tmp_path):
    args = ["--recipe", RECIPE, "--run-dir", str(tmp_path / "g"), "--dry-run"]
    assert submit_cli.main([*args, "--seeds", "1-2"]) == 0
    assert '#SBATCH --array="1-2"' in capsys.readouterr().out
    assert invoke(submit_cli.main, [*args, "--seeds", "x"]) == 2
    assert "is not a seed or a range" in capsys.readouterr().err
    assert invoke(submit_cli.main, [*args, "--seeds", "1", "grpo.seed=3"]) == 2
    assert "drop the grpo.seed override" in capsys.readouterr().err
    (tmp_path / "g" / "seed-2").mkdir(parents=True)
    (tmp_path / "g" / "seed-2" / "metrics.jsonl").write_text("")
    assert invoke(submit_cli.main, [*args, "--seeds", "1-2"]) == 2
    assert "seed-2: folder holds files that are not a run" in capsys.readouterr().err
    assert invoke(submit_cli.main, [*args, "--seeds", "1", "--resume", "--overwrite"]) == 2
    assert "--resume: continues a run and --overwrite starts it over" in capsys.readouterr().err


@pytest.fixture(scope="module")
def cluster() -> None:
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        pytest.skip("Slurm client commands not installed (start one: scripts/local-slurm.sh up)")
    proc = subprocess.run(
        ["sinfo", "-h", "-N", "-t", "idle,mixed,allocated", "-o", "%N"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0 or len(set(proc.stdout.split())) < 2:
        pytest.skip(f"need 2 responding Slurm nodes: {proc.stdout.strip()} {proc.stderr.strip()}")


@pytest.mark.slurm
@pytest.mark.slow
def test_job_array_two_seeds_each_a_two_node_ray_job(cluster, tmp_path, capsys):
    from nemo_fp8_rl.slurm import wait_for_state

    group = tmp_path / "fp8"
    args = ["--recipe", RECIPE, "--run-dir", str(group), "--nodes", "2", "--time", "00:15:00"]
    assert submit_cli.main([*args, "--seeds", "1-2", *FAST]) == 0
    out = capsys.readouterr().out
    job_id = re.search(r"Submitted job (\d+)", out).group(1)
    assert "Seeds: 1, 2" in out
    status = wait_for_state(job_id, timeout_s=900, poll_s=2.0)
    logs = {s: group / "slurm" / f"slurm-{job_id}_{s}.out" for s in (1, 2)}
    tails = "\n".join(p.read_text()[-2000:] for p in logs.values() if p.exists())
    assert status.state == "COMPLETED", f"{status}\n{tails}"
    tasks = array_tasks(job_id)
    assert [(t.job_id, t.state) for t in tasks] == [
        (f"{job_id}_1", "COMPLETED"),
        (f"{job_id}_2", "COMPLETED"),
    ]
    for seed in (1, 2):
        run_dir = group / f"seed-{seed}"
        log = logs[seed].read_text()
        assert "ray_wait: 2 Ray node(s) alive" in log and "training exited with code 0" in log
        assert (group / "slurm" / f"{job_id}_{seed}" / "ray-worker-0.log").is_file()
        saved = yaml.safe_load((run_dir / "recipe.yaml").read_text())
        assert saved["grpo"]["seed"] == seed
        metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in metrics if "train/loss" in m][-1] == 2
    assert submit_cli.main(["status", job_id]) == 0
    printed = capsys.readouterr().out
    assert f"job {job_id}: COMPLETED" in printed and f"task {job_id}_2: COMPLETED" in printed
    assert submit_cli.main(["logs", f"{job_id}_2"]) == 0
    assert "training exited with code 0" in capsys.readouterr().out
    # The two seeds differ (different init and sampling), so they are two distinct runs.
    one, two = (Path(group / f"seed-{s}" / "metrics.jsonl").read_text() for s in (1, 2))
    assert one != two
    # the same command again: both seeds finished, so nothing is submitted
    assert submit_cli.main([*args, "--seeds", "1-2", *FAST]) == 0
    again = capsys.readouterr().out
    assert "kept (finished before): 1, 2" in again and "Submitted" not in again


def test_array_state_of_the_whole_array():
    from nemo_fp8_rl.slurm.jobs import JobStatus, _array_state

    def tasks(*states):
        return [JobStatus(f"7_{i}", s) for i, s in enumerate(states, 1)]

    assert _array_state([]) is None
    assert _array_state(tasks("COMPLETED", "COMPLETED")).state == "COMPLETED"
    assert _array_state(tasks("COMPLETED", "RUNNING")).state == "RUNNING"
    assert _array_state(tasks("PENDING", "FAILED")).state == "PENDING"
    done = _array_state(tasks("COMPLETED", "FAILED"))
    assert (done.job_id, done.state, done.finished) == ("7", "FAILED", True)
