import sys

from frspec.cli import main

sys.exit(main())
