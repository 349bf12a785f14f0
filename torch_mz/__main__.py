r"""``python -m torch_mz ...``: the ``torch-mz`` command (:func:`torch_mz.cli.main`)."""
import sys

from torch_mz.cli import main

if __name__ == '__main__':
    sys.exit(main())
