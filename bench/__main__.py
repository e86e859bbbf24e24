"""``python -m bench``: run the suite and write ``bench/results/<date>.{json,md,png}``."""

from bench.run import main

raise SystemExit(main())
