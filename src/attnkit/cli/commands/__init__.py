"""Sub-commands of the `attnkit` command line, one module each (see :mod:`attnkit.cli`)."""
