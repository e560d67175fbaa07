import sys

from pipeline.main import main

if __name__ == "__main__":
    sys.exit(main())
