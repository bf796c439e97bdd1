"""The conductor, CLI, scenarios, world building, network process and results."""
