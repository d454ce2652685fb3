"""The ``mega`` command line; its subcommands are ``mega.commands`` plugins."""
