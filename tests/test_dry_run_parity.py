"""A dry run runs every check the real command runs, except starting work: each refusal of
the real command below is also its dry run's, word for word (`eval --dry-run` once ignored
`--samples`, `--pass-k` and `--num-problems`).
"""

from __future__ import annotations

import pytest
from test_catalogue import hf_source  # noqa: F401 (the session fixture)

from nemo_fp8_rl.cli import eval as eval_cli
from nemo_fp8_rl.cli.common import invoke

# eval arguments the real evaluation refuses before it starts (each with what it says)
EVAL_REFUSALS = [
    (["--pass-k", "8", "--samples", "4"], "--pass-k 8"),
    (["--samples", "2000"], "--samples"),
    (["--num-problems", "0"], "--num-problems"),
    (["--checkpoint", "step_99"], "step_99"),
]


@pytest.mark.parametrize(("argv", "says"), EVAL_REFUSALS)
def test_eval_dry_run_refuses_what_the_real_evaluation_refuses(
    argv,
    says,
    tmp_path,
    hf_source,  # noqa: F811
    capsys,
):
    from catalogue_cases import Workspace

    run = Workspace(tmp_path, hf_source).run()
    real = invoke(eval_cli.main, ["--run", str(run), *argv])
    real_err = capsys.readouterr().err
    dry = invoke(eval_cli.main, ["--run", str(run), *argv, "--dry-run"])
    dry_err = capsys.readouterr().err
    assert real == dry == 2 and says in real_err, real_err
    assert dry_err == real_err


def test_eval_dry_run_says_the_sampling_it_would_use(tmp_path, hf_source, capsys):  # noqa: F811
    from catalogue_cases import Workspace

    run = Workspace(tmp_path, hf_source).run()
    argv = ["--run", str(run), "--samples", "8", "--pass-k", "1,8", "--dry-run"]
    assert invoke(eval_cli.main, argv) == 0
    out = capsys.readouterr().out
    assert "8 sample(s) per problem" in out and "pass@1, pass@8" in out
