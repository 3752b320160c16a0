import sys

from slimpar.cli import main

sys.exit(main())
