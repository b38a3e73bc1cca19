"""pass@k and per-question comparisons of evaluations that share their problems.

pass@k per problem, from c correct among n samples (the unbiased estimator of Chen et al. 2021,
the one NeMo RL's `eval_pass_k` uses):

    pass@k = 1 − C(n − c, k) / C(n, k) = 1 − Π_{i = n−c+1}^{n} (1 − k / i)      (1 when n − c < k)

averaged over the problems; k ≤ n. `paired_by_question` compares two evaluations of the same
problems: per problem, the difference of success rates c_a/n_a − c_b/n_b, with the Student-t 95 %
interval of their mean over the problems (n = problems): the per-question paired interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from nemo_fp8_rl.analysis import stats


def pass_at_k_one(n: int, c: int, k: int) -> float:
    """pass@k of one problem with `c` of `n` samples correct (module doc)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_at_k(correct: Sequence[int], n: int, k: int) -> float:
    """Mean pass@k over problems with `correct[j]` of `n` samples correct."""
    if not correct:
        return math.nan
    return sum(pass_at_k_one(n, c, k) for c in correct) / len(correct)


def check_ks(ks: Sequence[int], n: int, where: str) -> list[int]:
    """The k values, refused (ValueError naming `where`) unless each is in 1..n."""
    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
        raise ValueError(
            f"{where}: pass@k needs 1 <= k <= samples per problem ({n}), got k = {bad}; "
            f"raise the samples per problem to at least {max(bad)} or drop those k"
        )
    return sorted(set(ks))


def paired_by_question(a: Sequence[int], n_a: int, b: Sequence[int], n_b: int) -> stats.Interval:
    """Mean over problems of c_a/n_a − c_b/n_b with its Student-t 95 % interval (module doc);
    the two lists hold the same problems in the same order."""
    if len(a) != len(b):
        raise ValueError(f"per-question pairing needs the same problems: {len(a)} against {len(b)}")
    diffs = [ca / n_a - cb / n_b for ca, cb in zip(a, b, strict=True)]
    return stats.mean_interval(diffs)
