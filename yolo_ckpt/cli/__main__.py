"""``python -m yolo_ckpt.cli``: the ``yolo-ckpt`` command."""

import sys

from .main import main

if __name__ == "__main__":  # imported (mkdocstrings, a test), it runs nothing: only 'python -m' runs the command
    sys.exit(main())
