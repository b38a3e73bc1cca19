"""The lines an embedded run ends with: what this run shows (`study.run_note`)."""

from __future__ import annotations

from nemo_fp8_rl.study.run_note import run_note


def _records(fp8: bool) -> list[dict]:
    rows = [{"step": 0, "validation/accuracy": 0.3}]
    for k in range(1, 31):
        row = {
            "step": k,
            "train/clip_lower_frac_neg": 0.02 if fp8 else 0.002,
            "train/clip_upper_frac_pos": 0.001,
            "train/calib_low": 0.8 - (0.005 * k if fp8 else 0.0),
            "train/entropy": 0.7 - 0.01 * k + (0.2 if k == 25 else 0.0),
        }
        if fp8 and k % 5 == 1:
            row |= {"train/fp8_nominal_lower_frac_neg": 0.03, "train/bf16_lower_frac_neg": 0.01}
            row |= {"train/ratio_nmae": 0.03, "train/single_pass_nmae": 0.03}
        rows.append(row)
    return rows


def test_fp8_run_note_names_shares_by_sign_compounding_and_entropy():
    text = "\n".join(run_note(_records(fp8=True)))
    assert "L moved 0.795 -> 0.650" in text and "A<0 below L 2.00 %" in text
    assert "A>0 above H 0.10 %" in text
    assert "FP8 ratio 3.00 %, BF16 ratio 1.00 % (3.0x)" in text
    assert "compounding (ratio error / one FP8 pass's error): 1.00" in text
    # entropy 0.69 -> 0.40 with a 0.2 bump at step 25: rise above the trailing minimum ≈ 0.19
    assert "entropy 0.670 -> 0.420" in text
    assert (
        "entropy surge onsets (z-score detector" in text and "): none;" in text
    )  # a 0.2 bump on a 0.01/step decline: z 1.6
    assert "minimum 0.190 nats (the study's endpoint, compared over seeds)" in text
    assert "docs/study/README.md" in text.splitlines()[-1]


def test_bf16_run_note_has_no_shadow_lines_and_nominal_bounds():
    lines = run_note(_records(fp8=False))
    text = "\n".join(lines)
    assert "the nominal bounds 0.80, 1.20" in text and "shadow steps" not in text
    assert "compounding" not in text and len(lines) == 4


def test_no_training_step_no_note():
    assert run_note([{"step": 0, "validation/accuracy": 0.3}]) == []
