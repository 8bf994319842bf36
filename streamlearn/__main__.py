from __future__ import annotations

import sys

from streamlearn.cli import main

sys.exit(main())
