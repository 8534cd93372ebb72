import sys

from paraxis.cli import main

sys.exit(main())
