"""``python -m supervisor`` runs the ``toolhost`` command."""

import sys

from supervisor.cli.main import main

sys.exit(main())
