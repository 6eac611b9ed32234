"""``python -m yolo_ckpt.cli``: the ``yolo-ckpt`` command."""

import sys

from .commands import main

sys.exit(main())
