"""`python -m nemo_fp8_rl.recipes`: same as the console script."""

from nemo_fp8_rl.cli.recipes import entry

if __name__ == "__main__":
    entry()
