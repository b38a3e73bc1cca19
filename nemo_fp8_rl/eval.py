"""`python -m nemo_fp8_rl.eval`: same as the console script."""

from nemo_fp8_rl.cli.eval import entry

if __name__ == "__main__":
    entry()
