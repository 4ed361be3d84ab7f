"""``python -m benchmarks.loadgen URL ...`` runs the same command as ``mmserve bench``."""

import sys

from benchmarks.loadgen.cli import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
