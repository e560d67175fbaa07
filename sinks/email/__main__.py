"""``python -m sinks.email``: see ``sinks/email/cli.py``."""

from sinks.email.cli import main

if __name__ == "__main__":
    main()
