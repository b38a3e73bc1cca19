"""`python -m nemo_fp8_rl.submit`: same as the console script."""

from nemo_fp8_rl.cli.submit import entry

if __name__ == "__main__":
    entry()
