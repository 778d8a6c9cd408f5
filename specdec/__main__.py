"""``python -m specdec`` (and ``torchrun ... -m specdec generate ... --tp N``): the ``specdec`` command line."""

from specdec.cli import main

if __name__ == "__main__":
    main()
