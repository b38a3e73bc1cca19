"""`python -m nemo_fp8_rl.refit`: same as the console script `nemo_fp8_rl.refit`."""

from nemo_fp8_rl.cli.refit import entry

entry()
