"""`python -m nemo_fp8_rl <command> ...`: every command under one name (`cli.commands`)."""

from nemo_fp8_rl.cli.commands import entry

if __name__ == "__main__":
    entry()
