"""`python -m nemo_fp8_rl.study`: the study's command line, `nemo_fp8_rl.cli.study`."""

from nemo_fp8_rl.cli.study import entry

if __name__ == "__main__":
    entry()
