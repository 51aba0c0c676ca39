"""One module per top-level command. Each has `register(subparsers)`, which adds its parser
and sets `handler(cfg, args) -> exit code`. `cli.py` turns errors into exit codes."""
