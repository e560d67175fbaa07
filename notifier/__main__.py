"""``python -m notifier``: see ``notifier/cli.py``."""

from notifier.cli import main

if __name__ == "__main__":
    main()
