"""`python -m nemo_fp8_rl.env`: same as the console script."""

from nemo_fp8_rl.cli.env import entry

if __name__ == "__main__":
    entry()
