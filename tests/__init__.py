"""attnkit's tests; a package so that ``tests.helpers`` is importable from every test folder."""
