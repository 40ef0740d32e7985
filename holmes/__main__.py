import sys

from holmes.cli.main import main

sys.exit(main())
