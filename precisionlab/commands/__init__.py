"""The command line's commands, one module per group; ``cli.py`` assembles them."""
