import sys

from distnerf.data.synthetic.primitives import main

sys.exit(main())
