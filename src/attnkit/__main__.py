"""`python -m attnkit` (and `torchrun -m attnkit`) runs the command line."""

from attnkit.cli import entry

if __name__ == "__main__":
    entry()
