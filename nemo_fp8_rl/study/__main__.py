"""`python -m nemo_fp8_rl.study`: the study's command line, `nemo_fp8_rl.cli.study`."""

import sys

from nemo_fp8_rl.cli.study import main

if __name__ == "__main__":
    sys.exit(main())
