"""`python -m nemo_fp8_rl.compare`: same as the console script."""

from nemo_fp8_rl.cli.compare import entry

if __name__ == "__main__":
    entry()
