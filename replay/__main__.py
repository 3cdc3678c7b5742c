"""``python -m replay`` runs the CLI."""

from replay.cli import main

main()
