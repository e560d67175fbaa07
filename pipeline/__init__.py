"""trainguard's entry points: the replay, the streaming job, and the tools on their stores."""

import time

IMPORTED_AT = time.monotonic()  # before Beam is imported: the replay's total time counts start-up from here
