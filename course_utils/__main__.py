"""`python -m course_utils ...`: see course_utils/cli.py."""

import sys

from course_utils.cli import main

sys.exit(main())
