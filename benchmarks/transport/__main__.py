"""``python -m transport`` (from ``benchmarks/``) or ``python benchmarks/transport``:
the same as ``python benchmarks/bench_transport.py``."""

import sys
from pathlib import Path

# the benchmarks' shared modules (and this package) live in the folder above
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transport.cli import main

sys.exit(main())
