"""`python -m nemo_fp8_rl.train`: same as the console script."""

from nemo_fp8_rl.cli.train import entry

if __name__ == "__main__":
    entry()
