"""The commands of `python -m training`, one module per command (training/__main__.py
registers them): each takes the parsed command line (argparse's Namespace) and, where it has
been converted, turns it into a typed config at once, so that the code below the command
sees fields with types and never the Namespace."""
