"""The `leasehold` command: main.py builds its parser and runs the command given."""
