"""pass@k (the unbiased estimator), its checks, and the per-question tables of `compare`."""

from __future__ import annotations

import itertools
import math

import pytest

from nemo_fp8_rl.cli.eval import with_sampling
from nemo_fp8_rl.config.user_error import UsageError
from nemo_fp8_rl.evals import table
from nemo_fp8_rl.evals.passk import check_ks, paired_by_question, pass_at_k, pass_at_k_one
from nemo_fp8_rl.evals.results import BenchmarkScore, EvalResult, write_result
from nemo_fp8_rl.evals.suites import ADDITION


@pytest.mark.parametrize(("n", "c", "k"), [(8, 0, 1), (8, 3, 1), (8, 3, 4), (8, 5, 4), (32, 1, 16)])
def test_estimator_is_the_share_of_k_subsets_with_a_correct_sample(n, c, k):
    """1 - C(n-c, k)/C(n, k): the share of the k-subsets of n samples holding a correct one."""
    samples = [1] * c + [0] * (n - c)
    if n <= 8:  # enumerate the subsets themselves
        subsets = list(itertools.combinations(samples, k))
        expect = sum(any(s) for s in subsets) / len(subsets)
    else:
        expect = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k_one(n, c, k) == pytest.approx(expect, rel=1e-12)


def test_pass_at_1_is_the_mean_success_rate_and_pass_at_n_any_success():
    correct, n = [0, 1, 4, 8, 2], 8
    assert pass_at_k(correct, n, 1) == pytest.approx(sum(correct) / (n * len(correct)))
    assert pass_at_k(correct, n, n) == pytest.approx(4 / 5)


def test_bad_k_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"1 <= k <= samples per problem \(4\), got k = \[16\]"):
        check_ks([1, 16], 4, "x")
    with pytest.raises(UsageError) as err:
        with_sampling(ADDITION, None, [1, 16])
    assert "--samples 16" in str(err.value)
    suite = with_sampling(ADDITION, 32, [16, 1, 4])
    assert suite.pass_ks == (1, 4, 16) and {b.samples for b in suite.benchmarks} == {32}


def test_paired_by_question_is_a_t_interval_over_problems():
    a, b = [4, 3, 2, 4], [2, 3, 1, 0]
    ci = paired_by_question(a, 4, b, 4)
    assert ci.n == 4 and ci.estimate == pytest.approx((0.5 + 0 + 0.25 + 1.0) / 4)
    assert ci.low < ci.estimate < ci.high
    with pytest.raises(ValueError, match="the same problems"):
        paired_by_question([1], 4, [1, 2], 4)


def _write(run_dir, recipe, precision, seed, correct, n=8):
    score = sum(correct) / (n * len(correct))
    bench = BenchmarkScore("add2", score, len(correct), n, "d", correct, (1, 4))
    result = EvalResult(
        "addition", run_dir.name, recipe, seed, precision, "local",
        {"selector": "last", "step": 10}, {}, {"add2-heldout": bench},
    )  # fmt: skip
    write_result(result, run_dir)


def test_compare_tables_show_pass_at_k_and_per_question_pairs(tmp_path):
    bf16 = [[8, 0, 4, 2], [6, 2, 4, 2]]
    fp8 = [[4, 0, 4, 0], [2, 0, 4, 1]]
    dirs = []
    for arm, runs in (("bf16", bf16), ("fp8", fp8)):
        for seed, correct in enumerate(runs, 1):
            d = tmp_path / f"{arm}-{seed}"
            _write(d, f"r-{arm}", arm, seed, correct)
            dirs.append(d)
    (t,) = table.collect(dirs)
    headers, rows = table.passk_rows(t)
    assert headers[-2:] == ["pass@1", "pass@4"]
    fp8_row = next(r for r in rows if r[0] == "r-fp8")
    expect = 100 * (pass_at_k(fp8[0], 8, 4) + pass_at_k(fp8[1], 8, 4)) / 2
    assert fp8_row[-1].startswith(f"{expect:.1f} [")
    _, q = table.question_rows(t)
    ((recipe, sel, bench, cell),) = q
    rate = lambda runs: [sum(r[j] for r in runs) / 16 for j in range(4)]  # noqa: E731
    diffs = [x - y for x, y in zip(rate(fp8), rate(bf16), strict=True)]
    assert recipe == "r-fp8" and cell.startswith(f"{100 * sum(diffs) / 4:+.1f} [")
    assert cell.endswith("(n=4 questions)")
    md = table.markdown([t])
    assert "## pass@k: addition" in md and "## Per-question paired differences" in md
