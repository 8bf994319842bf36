"""Subcommands of the ``streamlearn`` CLI, one module each (see ``streamlearn.cli``)."""
