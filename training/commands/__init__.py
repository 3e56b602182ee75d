"""The commands of `python -m training`, one module per command (training/__main__.py
registers them): each declares its options (or takes them from the module that shares them)
and turns the parsed command line (argparse's Namespace) into the command's typed config at
once (training/configs.py; RetrainConfig, PromoteConfig), so that the code below the command
sees fields with types and never the Namespace."""
