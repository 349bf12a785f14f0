r"""``python -m torch_mz.cli ...``: the ``torch-mz`` command (:func:`torch_mz.cli.main`), as
``python -m torch_mz``."""
import sys

from torch_mz.cli import main

if __name__ == '__main__':
    sys.exit(main())
