"""``python -m distnerf.data.synthetic``: see :mod:`distnerf.data.synthetic.cli`."""
import sys

from distnerf.data.synthetic.cli import main

sys.exit(main())
